"""`--api-prefix /PREFIX` (llama-server's): every route, the web page's included, under PREFIX, as a
reverse proxy forwards it; keys and CORS judge the unprefixed path; nothing answers outside it.
"""

from __future__ import annotations

import re

import pytest
from test_server_api import make_client
from test_server_cli import run_cli
from tiny_engine import running_tiny_engine

from slotserver.access.cors import CorsPolicy


@pytest.fixture(scope="module")
def tiny_engine(tmp_path_factory):
    with running_tiny_engine(tmp_path_factory.mktemp("tiny"), 2, 64) as running:
        yield running


def test_every_route_is_under_the_prefix_and_nothing_outside_it(tiny_engine):
    with make_client(tiny_engine, api_prefix="/llm/v2") as c:
        assert c.get("/llm/v2/health").json() == {"status": "ok"}
        r = c.post("/llm/v2/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}],
                                                        "max_tokens": 3, "temperature": 0})
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3
        for path in ("/health", "/v1/models", "/llm/health", "/llm/v2health", "/"):
            r = c.get(path)
            assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error", path


def test_the_web_page_and_its_files_resolve_under_the_prefix(tiny_engine):
    with make_client(tiny_engine, api_prefix="/llm") as c:
        r = c.get("/llm", follow_redirects=False)
        assert r.status_code == 308 and r.headers["location"] == "/llm/"
        page = c.get("/llm/").text
        links = re.findall(r'(?:href|src)="([^"]+)"', page)
        assert links and all(not link.startswith("/") for link in links), links   # relative to /llm/
        for link in links:
            assert c.get("/llm/" + link).status_code == 200, link


def test_keys_and_cors_see_the_unprefixed_path(tiny_engine):
    with make_client(tiny_engine, api_prefix="/llm", api_keys=("k",), cors=CorsPolicy(("http://ui.example",))) as c:
        assert c.get("/llm/health").status_code == 200   # public, as /health
        assert c.get("/llm/props").status_code == 401
        assert c.get("/llm/props", headers={"Authorization": "Bearer k"}).status_code == 200
        pre = c.options("/llm/v1/chat/completions", headers={"Origin": "http://ui.example",
                                                             "Access-Control-Request-Method": "POST"})
        assert pre.status_code == 200 and pre.headers["access-control-allow-origin"] == "http://ui.example"


@pytest.mark.parametrize("prefix", ["llm", "/llm/", "/llm?x=1", "/"])
def test_a_bad_prefix_is_one_line_and_status_2(capsys, prefix):
    status, err = run_cli(capsys, "--api-prefix", prefix)
    assert status == 2 and len(err) == 1 and "--api-prefix" in err[0], err
