"""Who can reach what over HTTP: content types, CORS, API keys, --no-lab-api, --max-queue, and
text that is not valid Unicode. In-process on a tiny model.

The inference routes read the body as JSON whatever its Content-Type (as llama-server, so
`curl -d '{...}'` works); the lab's verbs, which change the code the engine runs, take only
application/json and never answer a cross-origin preflight, so no web page can call them.
"""

from __future__ import annotations

import pytest
from tiny_engine import running_tiny_engine

from slotserver.access.cors import CorsPolicy
from slotserver.engine.engine import Engine
from slotserver.engine.config import EngineConfig
from slotserver.engine.request import Request
from slotserver.server import ServerConfig, ServerState, create_app
from slotserver.server.config_from_args import plan_from_args, server_config_from_args
from starlette.testclient import TestClient
from test_server_api import ERROR_TYPES, make_client
from test_server_cli import parse, run_cli

JSON = {"content-type": "application/json"}
FORM = {"content-type": "application/x-www-form-urlencoded"}   # what `curl -d` sends
BROWSER_SIMPLE_TYPES = ["text/plain", "text/plain;charset=UTF-8", "application/x-www-form-urlencoded",
                        "multipart/form-data; boundary=x", "application/json, text/plain", None]
LAB_VERBS = {"/lab/layout": b'{"layout": "head_seq_dim"}', "/lab/reload": b"{}"}
ORIGIN = "http://ui.example"


def assert_error(r, status: int) -> dict:
    """`r` is a JSON error with this status (403 and 415 added to test_server_api's types)."""
    types = {**ERROR_TYPES, 403: "permission_error", 415: "invalid_request_error"}
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["code"] == status and err["type"] == types[status] and err["message"]
    return err


@pytest.fixture(scope="module")
def tiny_engine(tmp_path_factory):
    with running_tiny_engine(tmp_path_factory.mktemp("tiny"), 2, 64) as running:
        yield running


@pytest.fixture(scope="module")
def client(tiny_engine):
    with make_client(tiny_engine) as c:
        yield c


def layout_name(client) -> str:
    return client.get("/lab").json()["layout"]["name"]


def test_curl_form_content_type_is_read_as_json(client):
    body = b'{"prompt": "hi", "n_predict": 2, "ignore_eos": true}'
    r = client.post("/completion", content=body, headers=FORM)
    assert r.status_code == 200 and r.json()["tokens_predicted"] == 2, r.text
    r = client.post("/tokenize", content=b'{"content": "hi"}', headers={"content-type": "text/plain"})
    assert r.status_code == 200 and r.json()["tokens"], r.text
    r = client.post("/v1/chat/completions", content=b'{"messages": [{"role": "user", "content": "hi"}], '
                                                    b'"max_tokens": 1, "ignore_eos": true}')
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 1, r.text


@pytest.mark.parametrize("ctype", BROWSER_SIMPLE_TYPES, ids=str)
@pytest.mark.parametrize("path", LAB_VERBS)
def test_lab_verbs_take_only_application_json(client, path, ctype):
    before = layout_name(client)
    headers = {} if ctype is None else {"content-type": ctype}
    err = assert_error(client.post(path, content=LAB_VERBS[path], headers=headers), 415)
    assert "application/json" in err["message"]
    assert layout_name(client) == before


def test_lab_verbs_work_with_application_json(client):
    current = layout_name(client)
    target = next(n for n in client.get("/lab").json()["layouts"] if n != current)
    r = client.post("/lab/layout", content=f'{{"layout": "{target}"}}'.encode(),
                    headers={"content-type": "application/json; charset=utf-8"})
    assert r.status_code == 200, r.text
    assert layout_name(client) == target


def test_the_lab_never_gets_cors_headers_even_with_cors(tiny_engine):
    origin = {"Origin": ORIGIN}
    with make_client(tiny_engine, cors=CorsPolicy((ORIGIN,))) as c:
        control = c.options("/completion", headers={**origin, "Access-Control-Request-Method": "POST"})
        assert control.headers["access-control-allow-origin"] == ORIGIN
        for path in ("/lab/layout", "/lab/reload"):
            pre = c.options(path, headers={**origin, "Access-Control-Request-Method": "POST",
                                           "Access-Control-Request-Headers": "content-type"})
            assert pre.status_code != 200 and "access-control-allow-origin" not in pre.headers, pre.headers
            r = c.post(path, content=LAB_VERBS[path], headers={**origin, "content-type": "text/plain"})
            assert r.status_code == 415 and "access-control-allow-origin" not in r.headers
        assert "access-control-allow-origin" not in c.get("/lab", headers=origin).headers


@pytest.mark.parametrize("path", ["/slots/0", "/slots", "/metrics", "/lab"])
def test_slots_and_metrics_get_no_cors_even_with_cors(tiny_engine, path):
    """The README promises CORS for inference endpoints only: a page must not erase or save slots."""
    origin = {"Origin": ORIGIN}
    with make_client(tiny_engine, cors=CorsPolicy((ORIGIN,))) as c:
        pre = c.options(path, headers={**origin, "Access-Control-Request-Method": "POST",
                                       "Access-Control-Request-Headers": "content-type"})
        assert pre.status_code != 200 and "access-control-allow-origin" not in pre.headers, pre.headers
        r = c.get(path, headers=origin)
        assert "access-control-allow-origin" not in r.headers, (path, r.headers)


@pytest.mark.parametrize("path", ["/completion", "/v1/chat/completions", "/tokenize", "/apply-template",
                                  "/v1/models", "/v1/models/some-id", "/props", "/health"])
def test_inference_and_info_endpoints_get_cors_with_cors(tiny_engine, path):
    origin = {"Origin": ORIGIN}
    with make_client(tiny_engine, cors=CorsPolicy((ORIGIN,))) as c:
        pre = c.options(path, headers={**origin, "Access-Control-Request-Method": "POST",
                                       "Access-Control-Request-Headers": "content-type"})
        assert pre.status_code == 200 and pre.headers["access-control-allow-origin"] == ORIGIN, path


def test_the_lab_needs_the_api_key(tiny_engine):
    with make_client(tiny_engine, api_keys=("secret",)) as c:
        for method, path in [("GET", "/lab"), ("GET", "/lab/events"), ("POST", "/lab/layout"),
                             ("POST", "/lab/reload")]:
            r = c.request(method, path, content=LAB_VERBS.get(path), headers=JSON)
            assert assert_error(r, 401)["message"] == "Invalid API Key", path
            wrong = c.request(method, path, content=LAB_VERBS.get(path), headers={**JSON, "X-Api-Key": "nope"})
            assert_error(wrong, 401)
        r = c.get("/lab", headers={"Authorization": "Bearer secret"})
        assert r.status_code == 200 and "layout" in r.json()
        r = c.post("/lab/layout", json={"layout": "no/such"}, headers={"Authorization": "Bearer secret"})
        assert r.status_code == 400  # past the key check: the lab itself refuses the name


def test_no_lab_api_turns_the_verbs_off_and_leaves_the_snapshot(tiny_engine):
    with make_client(tiny_engine, lab_api=False) as c:
        before = layout_name(c)
        for path, body in LAB_VERBS.items():
            err = assert_error(c.post(path, content=body, headers=JSON), 403)
            assert "--no-lab-api" in err["message"]
        assert layout_name(c) == before


def test_no_lab_api_and_max_queue_flags_reach_the_configs():
    args = parse("--no-lab-api", "--max-queue", "3")
    assert server_config_from_args(args).lab_api is False and plan_from_args(args).engine.queue_limit == 3
    args = parse()
    assert server_config_from_args(args).lab_api is True and plan_from_args(args).engine.queue_limit == 256


def test_a_negative_max_queue_is_one_line_and_exit_2(capsys):
    status, lines = run_cli(capsys, "--max-queue", "-1")
    assert status == 2 and len(lines) == 1 and "--max-queue must be an integer >= 0" in lines[0], lines


def test_a_full_queue_is_503_saying_how_to_raise_it(tiny_engine):
    bundle, _ = tiny_engine
    idle = Engine(bundle, EngineConfig(n_parallel=1, ctx_size=32, queue_limit=0))  # never started
    idle.submit(Request((1, 2, 3), n_predict=2))                                  # holds the one slot
    state = ServerState(ServerConfig(model_path=str(bundle.config.model_path)))
    state.set_loaded(bundle, idle)
    with TestClient(create_app(state)) as c:
        err = assert_error(c.post("/completion", json={"prompt": "hi", "n_predict": 1}), 503)
    assert "all 1 slots are in use" in err["message"] and "holds 0 waiting requests" in err["message"]
    assert "start the server with --max-queue 16" in err["message"], err["message"]


@pytest.mark.parametrize("path, body, field", [
    ("/completion", b'{"prompt": "ab\\ud800", "n_predict": 1}',
     "'prompt' is not valid Unicode (lone surrogate at index 2)"),
    ("/v1/chat/completions",
     b'{"messages": [{"role": "user", "content": "ok"}, {"role": "user", "content": "\\udc00x"}]}',
     "'messages[1].content' is not valid Unicode (lone surrogate at index 0)"),
    ("/tokenize", b'{"content": "x\\ud83d"}', "'content' is not valid Unicode (lone surrogate at index 1)"),
    ("/completion", b'{"prompt": "hi", "logit_bias": {"\\ud800": 1}}', "a key of 'logit_bias' is not valid Unicode"),
    ("/completion", b'{"prompt": "hi", "stop": ["a", "b\\udfff"]}', "'stop[1]' is not valid Unicode"),
    ("/lab/layout", b'{"layout": "\\ud800"}', "'layout' is not valid Unicode"),
])
def test_a_lone_surrogate_is_400_naming_the_field(client, path, body, field):
    err = assert_error(client.post(path, content=body, headers=JSON), 400)
    assert field in err["message"], err["message"]


def test_a_surrogate_pair_is_one_valid_character(client):
    r = client.post("/tokenize", content=b'{"content": "\\ud83d\\ude00"}', headers=JSON)
    assert r.status_code == 200 and r.json()["tokens"], r.text


@pytest.mark.parametrize("action", ["save", "restore"])
@pytest.mark.parametrize("ctype", ["text/plain", "application/x-www-form-urlencoded", None])
def test_slot_save_and_restore_take_only_application_json(tiny_engine, tmp_path, action, ctype):
    """They write a file or replace a slot's state: no cross-origin simple request may reach them."""
    with make_client(tiny_engine, slot_save_path=str(tmp_path)) as c:
        headers = {} if ctype is None else {"content-type": ctype}
        r = c.post(f"/slots/0?action={action}", content=b'{"filename": "s.bin"}', headers=headers)
        assert "application/json" in assert_error(r, 415)["message"]
        assert list(tmp_path.iterdir()) == []
        r = c.post("/slots/0?action=erase")          # erase drops a cache only: no body needed
        assert r.status_code != 415


def test_kv_pool_cells_reaches_the_engine_and_a_bad_value_is_refused():
    """--kv-pool-cells caps a paged layout's pool (admission by blocks: tests/test_paged_memory.py)."""
    assert plan_from_args(parse("--kv-pool-cells", "512")).engine.kv_pool_cells == 512
    assert plan_from_args(parse()).engine.kv_pool_cells is None
    from slotserver.errors import ConfigError
    with pytest.raises(ConfigError, match="--kv-pool-cells must be an integer >= 1"):
        plan_from_args(parse("--kv-pool-cells", "0"))
