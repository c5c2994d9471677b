"""Router mode through HTTP, as clients use it: one `slotserver serve --models-dir` with the default
model and a tiny one and --models-max 1, each model in its own child server.

Requests pick the model by their `model` field and load it on demand; a second model evicts the
least recently used one; /models lists both with their status; load/unload, autoload off, API
key, CORS, metrics labelled by model, and a client that disconnects mid-stream frees the child's slot.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import httpx
import pytest
from test_server_e2e import serving

from slotserver.model.default_model import default_model_path

ARCHS = Path(__file__).parent / "fixtures" / "archs"
KEY = {"Authorization": "Bearer router-key"}


@pytest.fixture(scope="module")
def router(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("router")
    (tmp / "models").mkdir()
    (tmp / "models" / "a.gguf").symlink_to(default_model_path())   # slow enough to leave mid-stream
    (tmp / "models" / "b.gguf").symlink_to(ARCHS / "llama3_freqs.gguf")
    (tmp / "models" / "broken.gguf").write_bytes(b"GGUF" + bytes(60))   # its server exits at load
    (tmp / "hub").mkdir()   # an empty hub cache: the host's own is not listed
    # llama-server's variables are the router's: a child that read them would become a router itself
    # (-m with --models-dir is refused) or take the router's key; the router gives them a clean environment
    os.environ |= {"LLAMA_ARG_MODELS_DIR": str(tmp / "models"), "LLAMA_API_KEY": "env-key"}
    try:
        with serving(tmp, "--models-dir", str(tmp / "models"), "--models-cache", str(tmp / "hub"), "--models-max", "1",
                     "-c", "2048", "-np", "1", "--no-warmup", "--no-watch", "--metrics", "--api-key", "router-key",
                     "--cors-origins", "localhost") as srv:
            srv.http.headers.update(KEY)
            yield srv
    finally:
        for name in ("LLAMA_ARG_MODELS_DIR", "LLAMA_API_KEY"):
            del os.environ[name]


def statuses(router) -> dict[str, str]:
    return {m["id"]: m["status"]["value"] for m in router.get("/v1/models").json()["data"]}


def wait_status(router, name: str, want: str, timeout: float = 60) -> None:
    deadline = time.time() + timeout
    while statuses(router)[name] != want:
        assert time.time() < deadline, f"{name} never became {want}: {statuses(router)}"
        time.sleep(0.05)


def chat(router, model: str, **kw) -> httpx.Response:
    return router.post("/v1/chat/completions", {"model": model, "messages": [{"role": "user", "content": "hi"}],
                                                "max_tokens": 8, "temperature": 0, **kw})


def test_lists_every_model_and_needs_the_key_elsewhere(router):
    assert statuses(router) == {"a": "unloaded", "b": "unloaded", "broken": "unloaded"}
    assert httpx.get(router.url + "/v1/models").status_code == 200          # public, as llama-server
    assert httpx.get(router.url + "/props").json()["error"]["type"] == "authentication_error"
    assert router.get("/v1/models/b").json()["status"]["value"] == "unloaded"
    assert router.get("/v1/models/zz").json()["error"]["code"] == "model_not_found"
    props = router.get("/props").json()
    assert (props["role"], props["max_instances"], props["models_autoload"]) == ("router", 1, True)


def test_a_request_loads_its_model_and_streams_the_same_answer(router):
    r = chat(router, "a")
    assert r.status_code == 200, r.text
    assert r.json()["model"] == "a" and statuses(router)["a"] == "loaded"
    args = next(m for m in router.get("/v1/models").json()["data"] if m["id"] == "a")["status"]["args"]
    child = f"http://127.0.0.1:{args[args.index('--port') + 1]}"
    assert httpx.post(child + "/completion", json={"prompt": "x"}, headers=KEY).status_code == 401, \
        "a model's own server must not be reachable past the router"
    text = r.json()["choices"][0]["message"]["content"]
    with router.http.stream("POST", router.url + "/v1/chat/completions", json={
            "model": "a", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8, "temperature": 0,
            "stream": True}) as s:
        lines = [ln[6:] for ln in s.iter_lines() if ln.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    streamed = "".join(json.loads(x)["choices"][0]["delta"].get("content") or "" for x in lines[:-1]
                       if json.loads(x)["choices"])
    assert streamed == text


def test_a_client_that_leaves_mid_stream_frees_the_childs_slot(router):
    body = {"model": "a", "prompt": "once upon", "n_predict": 1000, "ignore_eos": True, "stream": True}
    with router.http.stream("POST", router.url + "/completion", json=body) as s:
        lines = s.iter_lines()   # kept: a dropped iterator would close the stream at once
        first = next(lines)      # the first token is out: the child is generating
        assert s.status_code == 200 and first.startswith("data: "), first
        started = time.time()   # (/slots is the engine's stats snapshot: it may lag a step behind)
        while not router.get("/slots?model=a").json()[0]["is_processing"]:
            assert time.time() - started < 10, f"the child's slot never showed the request: {first}"
            time.sleep(0.01)
    left, decoded = time.time(), 0
    while (slot := router.get("/slots?model=a").json()[0])["is_processing"]:
        decoded = slot["next_token"][0]["n_decoded"]
        assert time.time() - left < 60, f"the child still generates ({decoded} tokens) for a client that left"
        time.sleep(0.01)
    assert decoded < 1000 / 2, f"the child generated {decoded} of 1000 tokens for a client that had left"


def test_another_model_evicts_the_least_recently_used(router):
    r = chat(router, "b")
    assert r.status_code == 200 and r.json()["model"] == "b"
    assert statuses(router) == {"a": "unloaded", "b": "loaded", "broken": "unloaded"}


def test_metrics_carry_the_model_label(router):
    chat(router, "b")
    text = router.get("/metrics").text
    assert 'llamacpp:prompt_tokens_total{model="b"}' in text and 'model="a"' not in text
    own = router.get("/metrics?model=b").text
    assert "llamacpp:prompt_tokens_total " in own   # the child's own, unlabelled


def test_each_model_has_its_own_lab(router):
    chat(router, "b")
    assert router.get("/lab?model=b").json()["layout"]["name"] == "head_seq_dim"
    r = router.post("/lab/layout?model=b", {"layout": "seq_head_dim"})
    assert r.status_code == 200, r.text
    assert router.get("/lab?model=b").json()["layout"]["name"] == "seq_head_dim"
    assert router.get("/lab").json()["error"]["message"] == "model name is missing from the request"


def test_load_unload_and_the_errors_llama_server_gives(router):
    chat(router, "b")
    assert router.post("/models/load", {"model": "b"}).json()["error"]["message"] == "model is already running"
    assert router.post("/models/load", {"model": "zz"}).status_code == 404
    assert router.post("/models/unload", {"model": "b"}).json() == {"success": True}
    wait_status(router, "b", "unloaded")
    assert router.post("/models/unload", {"model": "b"}).json()["error"]["message"] == "model is not running"
    assert chat(router, "zz").json()["error"]["message"] == "model 'zz' not found"
    assert router.post("/completion", {"prompt": "x"}).json()["error"]["message"] == \
        "model name is missing from the request"
    r = router.http.post(router.url + "/completion", content=b"{not json")
    assert (r.status_code, r.json()["error"]["message"]) == (400, "the request body is not valid JSON")
    r = router.post("/v1/chat/completions?autoload=false", {"model": "b", "messages": []})
    assert (r.status_code, r.json()["error"]["message"]) == (400, "model is not loaded")
    assert statuses(router)["b"] == "unloaded"
    assert router.post("/models/load", {"model": "b"}).json() == {"success": True}
    wait_status(router, "b", "loaded")


def test_a_model_that_fails_to_load_is_an_error_and_listed_as_failed(router):
    r = chat(router, "broken")
    assert (r.status_code, r.json()["error"]["message"]) == (500, "model name=broken failed to load")
    status = next(m["status"] for m in router.get("/v1/models").json()["data"] if m["id"] == "broken")
    assert (status["value"], status["failed"], status["exit_code"]) == ("unloaded", True, 2)
    assert router.get("/props").json()["role"] == "router"   # the router goes on serving


def test_the_router_answers_cors_once_and_never_for_model_loading(router):
    origin, other = {"Origin": "http://localhost:5173"}, {"Origin": "http://evil.example"}
    ask = {"Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "authorization"}
    pre = httpx.options(router.url + "/v1/chat/completions", headers={**origin, **ask})   # no key: a preflight
    assert pre.status_code == 200 and pre.headers["access-control-allow-origin"] == origin["Origin"]
    assert pre.headers["access-control-allow-headers"] == "authorization"
    for path in ("/models/load", "/models/unload", "/slots"):
        refused = httpx.options(router.url + path, headers={**origin, **ask})
        assert "access-control-allow-origin" not in refused.headers, path
    r = router.http.post(router.url + "/v1/chat/completions", headers=origin, json={
        "model": "b", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "temperature": 0})
    assert r.status_code == 200 and r.headers.get_list("access-control-allow-origin") == [origin["Origin"]]
    assert "access-control-allow-origin" not in router.http.get(router.url + "/health", headers=other).headers
