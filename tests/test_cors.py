"""CORS with llama-server's flags (`--cors-origins`, `--cors-methods`, `--cors-headers`,
`--cors-credentials`), as a browser sees it through the server's HTTP app: what a preflight and an
answer carry for each kind of origin value, and that a bad value stops the server with one line.
"""

from __future__ import annotations

import pytest
from test_server_api import make_client
from tiny_engine import running_tiny_engine
from test_server_cli import parse, run_cli

from slotserver.access.cors import CorsPolicy
from slotserver.server.config_from_args import server_config_from_args

@pytest.fixture(scope="module")
def tiny_engine(tmp_path_factory):
    with running_tiny_engine(tmp_path_factory.mktemp("tiny"), 2, 64) as running:
        yield running


ASK = {"Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "Authorization, Content-Type"}


def preflight(c, origin: str, path: str = "/v1/chat/completions", **extra):
    return c.options(path, headers={"Origin": origin, **ASK, **extra})


def test_flags_make_the_policy_as_llama_server_spells_them():
    args = parse("--cors-origins", "http://a.example, https://b.example:8443", "--cors", "http://c.example",
                 "--cors-methods", "GET, POST", "--cors-headers", "Authorization", "--no-cors-credentials")
    assert server_config_from_args(args).cors == CorsPolicy(
        ("http://a.example", "https://b.example:8443", "http://c.example"), "GET, POST", "Authorization", False)
    default = server_config_from_args(parse()).cors
    assert default.origins == () and (default.methods, default.headers, default.credentials) == (
        "GET, POST, DELETE, OPTIONS", "*", True)


@pytest.mark.parametrize("value, problem", [
    ("http://ui.example/", "is not an origin"), ("ui.example", "is not an origin"),
    ("*,http://ui.example", "stands alone"), ("localhost,http://ui.example", "stands alone")])
def test_a_bad_origin_value_is_one_line_and_status_2(capsys, value, problem):
    status, err = run_cli(capsys, "--cors-origins", value)
    assert status == 2 and len(err) == 1 and problem in err[0] and "--cors-origins" in err[0], err


def test_any_origin_with_credentials_echoes_the_origin_and_the_asked_headers(tiny_engine):
    with make_client(tiny_engine, cors=CorsPolicy(("*",))) as c:
        pre = preflight(c, "http://anything.example")
        assert pre.status_code == 200
        assert pre.headers["access-control-allow-origin"] == "http://anything.example"
        assert pre.headers["access-control-allow-credentials"] == "true"
        assert pre.headers["access-control-allow-methods"] == "GET, POST, DELETE, OPTIONS"
        assert pre.headers["access-control-allow-headers"] == "Authorization, Content-Type"
        r = c.post("/tokenize", json={"content": "hi"}, headers={"Origin": "http://anything.example"})
        assert r.status_code == 200 and r.headers["access-control-allow-origin"] == "http://anything.example"


def test_any_origin_without_credentials_is_a_star(tiny_engine):
    with make_client(tiny_engine, cors=CorsPolicy(("*",), credentials=False)) as c:
        pre = preflight(c, "http://anything.example")
        assert pre.headers["access-control-allow-origin"] == "*"
        assert "access-control-allow-credentials" not in pre.headers
        r = c.get("/health", headers={"Origin": "http://anything.example"})
        assert r.headers["access-control-allow-origin"] == "*"


@pytest.mark.parametrize("origin, allowed", [
    ("http://localhost", True), ("http://localhost:8080", True), ("https://127.0.0.1:3000", True),
    ("http://[::1]", True), ("http://[::1]:5173", True), ("http://localhost.evil.com", False),
    ("http://notlocalhost", False), ("http://evil.com", False), ("http://127.0.0.1.evil.com", False)])
def test_localhost_reflects_only_localhost_origins(tiny_engine, origin, allowed):
    with make_client(tiny_engine, cors=CorsPolicy(("localhost",))) as c:
        pre = preflight(c, origin)
        assert pre.headers.get("access-control-allow-origin") == (origin if allowed else None)
        r = c.get("/props", headers={"Origin": origin})
        assert r.status_code == 200 and r.headers.get("access-control-allow-origin") == (origin if allowed else None)


def test_a_list_allows_exactly_its_origins_and_methods(tiny_engine):
    policy = CorsPolicy(("http://a.example", "http://b.example:3000"), methods="GET")
    with make_client(tiny_engine, cors=policy) as c:
        ok = preflight(c, "http://b.example:3000", path="/v1/models", **{"Access-Control-Request-Method": "GET"})
        assert ok.status_code == 200 and ok.headers["access-control-allow-origin"] == "http://b.example:3000"
        for origin in ("http://b.example", "http://c.example"):   # another port, another host
            assert "access-control-allow-origin" not in preflight(c, origin, path="/v1/models").headers
            assert "access-control-allow-origin" not in c.get("/health", headers={"Origin": origin}).headers
        assert preflight(c, "http://a.example").status_code == 400   # POST is not in --cors-methods
