"""The HTTP API in-process (starlette's TestClient) on a tiny random model: what clients rely on.

One engine serves the module; each test builds the app it needs around it (API keys, CORS,
--no-slots...). The tiny model is random, so tests compare the server with itself (streaming vs
not, one prompt form vs another) or check formats and counts, never the text's meaning.
"""

from __future__ import annotations

import json
import math
import re
import threading
import time
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from slotserver.access.cors import CorsPolicy
from slotserver.model.text.chat_template import CHATML_TEMPLATE, ChatTemplate
from slotserver.server import ServerConfig, ServerState, create_app
from tiny_engine import running_tiny_engine

N_PARALLEL, CTX = 2, 128          # 64 cells per slot
ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
               405: "invalid_request_error", 413: "invalid_request_error", 501: "not_supported_error",
               503: "unavailable_error"}


@pytest.fixture(scope="module")
def tiny_engine(tmp_path_factory):
    """(bundle, engine) on a tiny model; one torch thread (tiny ops only lose from threading)."""
    with running_tiny_engine(tmp_path_factory.mktemp("tiny"), N_PARALLEL, CTX) as running:
        yield running


def make_client(tiny_engine, **config) -> TestClient:
    bundle, engine = tiny_engine
    state = ServerState(ServerConfig(model_path=str(bundle.config.model_path), **config))
    state.set_loaded(bundle, engine)
    return TestClient(create_app(state))


@pytest.fixture(scope="module")
def client(tiny_engine):
    with make_client(tiny_engine, metrics=True) as c:
        yield c


def assert_error(r, status: int) -> dict:
    """`r` is llama-server's JSON error with this status; -> the error object."""
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["code"] == status and err["type"] == ERROR_TYPES[status] and err["message"]
    return err


def sse_events(text: str) -> list[str]:
    """The `data:` payloads of an SSE body, checking the framing: `data: ...` lines, blank-separated."""
    assert text.endswith("\n\n"), repr(text[-50:])
    blocks = text[:-2].split("\n\n")
    assert all(b.startswith("data: ") and "\n" not in b for b in blocks), blocks[:3]
    return [b[len("data: "):] for b in blocks]


def greedy(client, prompt, n=8, **extra) -> dict:
    body = {"prompt": prompt, "n_predict": n, "temperature": 0, "return_tokens": True, **extra}
    r = client.post("/completion", json=body)
    assert r.status_code == 200, r.text
    return r.json()


def test_health_is_503_loading_until_the_model_is_published(tiny_engine):
    bundle, engine = tiny_engine
    state = ServerState(ServerConfig())
    with TestClient(create_app(state)) as c:
        r = c.get("/health")
        assert r.status_code == 503
        assert r.json() == {"error": {"code": 503, "message": "Loading model", "type": "unavailable_error"}}
        assert_error(c.post("/completion", json={"prompt": "hi"}), 503)
        state.set_loaded(bundle, engine)
        r = c.get("/health")
        assert (r.status_code, r.json()) == (200, {"status": "ok"})


def test_tokenize_defaults_pieces_and_detokenize_round_trip(client, tiny_engine):
    tok = tiny_engine[0].tokenizer
    text = "<|im_start|>Hello world é"
    ids = client.post("/tokenize", json={"content": text}).json()["tokens"]
    assert ids == tok.encode(text, add_special=False, parse_special=True)   # llama-server's defaults
    assert ids[0] == tok.token_to_id("<|im_start|>")
    plain = client.post("/tokenize", json={"content": text, "parse_special": False}).json()["tokens"]
    assert tok.token_to_id("<|im_start|>") not in plain
    pieces = client.post("/tokenize", json={"content": text, "with_pieces": True}).json()["tokens"]
    assert [p["id"] for p in pieces] == ids
    assert pieces[0]["piece"] == "<|im_start|>"
    assert pieces[-2:] == [{"id": ids[-2], "piece": [0xC3]}, {"id": ids[-1], "piece": [0xA9]}]  # é split
    assert client.post("/detokenize", json={"tokens": ids}).json() == {"content": text}


def test_apply_template_renders_the_model_template_and_ignores_one_in_the_request(client):
    messages = [{"role": "user", "content": "hi"}]
    expected = ChatTemplate(CHATML_TEMPLATE).render(messages, add_generation_prompt=True)
    r = client.post("/apply-template", json={"messages": messages, "chat_template": "{{ 'pwned' }}"})
    assert r.json() == {"prompt": expected}
    assert_error(client.post("/apply-template", json={"messages": "hi"}), 400)


def test_props_and_models_describe_the_server(client, tiny_engine):
    props = client.get("/props").json()
    assert props["total_slots"] == N_PARALLEL
    assert props["default_generation_settings"]["n_ctx"] == CTX // N_PARALLEL
    assert props["chat_template"] == tiny_engine[0].template.source
    assert props["eos_token"] == "<|im_end|>"
    # ours: what the model computes in and its matmul weights, which top's header shows (not "dtype ?")
    assert (props["dtype"], props["weights"]) == (str(tiny_engine[0].model.dtype).removeprefix("torch."),
                                                  tiny_engine[0].config.weight_format.kind)
    from slotserver.top.parse import parse_header
    assert parse_header({}, {}, props, []).dtype == props["dtype"] != "?"
    assert props["device"] == tiny_engine[0].model.device == "cpu"   # ModelConfig's library default
    assert props["gpu_weights"] == "auto"   # --gpu-weights: resolved at load on CUDA only
    assert parse_header({}, {}, props, []).device == "cpu"
    assert props["async_steps"] == {"mode": "auto", "on": False}   # overlapped decode: auto is on only on CUDA
    assert client.get("/lab").json()["device"] == "cpu"
    models = client.get("/v1/models").json()
    assert models["object"] == "list" and models["data"][0]["object"] == "model"
    assert models["data"][0]["id"] == Path(props["model_path"]).name == props["model_alias"]


def test_the_model_id_is_the_file_name_and_the_sdk_retrieves_it(client, tiny_engine):
    """As llama-server: the id is the file's name (not the absolute path it happens to sit at),
    and the OpenAI SDK's models.retrieve(id) finds it; an unknown id is OpenAI's 404."""
    from openai import NotFoundError, OpenAI
    path = tiny_engine[0].config.model_path
    sdk = OpenAI(base_url="http://testserver/v1", api_key="none", http_client=client)
    [listed] = sdk.models.list().data
    assert listed.id == Path(path).name and "/" not in listed.id
    assert sdk.models.retrieve(listed.id).id == listed.id
    assert client.get(f"/v1/models/{path}").json()["id"] == listed.id   # the old id still resolves
    with pytest.raises(NotFoundError):
        sdk.models.retrieve("no-such-model")
    err = client.get("/v1/models/no-such-model").json()["error"]
    assert err["code"] == "model_not_found" and err["type"] == "invalid_request_error"
    assert "no-such-model" in err["message"]
    old_id = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1, "model": str(path)}
    r = client.post("/v1/chat/completions", json=old_id)   # a request naming the old long id still runs
    assert r.status_code == 200 and r.json()["model"] == str(path)


def test_alias_is_the_model_id(tiny_engine):
    with make_client(tiny_engine, alias="smol") as c:
        assert c.get("/v1/models").json()["data"][0]["id"] == "smol"
        assert c.get("/v1/models/smol").json()["id"] == "smol"
        assert c.get("/props").json()["model_alias"] == "smol"


def test_non_streaming_completion_reports_llama_server_fields(client, tiny_engine):
    n_prompt = len(tiny_engine[0].tokenizer.encode("Hello world", parse_special=True))
    out = greedy(client, "Hello world", n=6, n_probs=3)
    assert out["stop"] is True and out["stop_type"] == "limit" and out["tokens_predicted"] == 6
    assert len(out["tokens"]) == 6 and out["tokens_evaluated"] == n_prompt and out["truncated"] is False
    t = out["timings"]
    assert t["predicted_n"] == 6 and t["prompt_n"] + t["cache_n"] == n_prompt and t["predicted_ms"] > 0
    probs = out["completion_probabilities"]
    assert [p["id"] for p in probs] == out["tokens"]
    for p in probs:
        assert len(p["top_logprobs"]) == 3 and p["top_logprobs"][0]["logprob"] >= p["logprob"] - 1e-6
        assert p["bytes"] == list(bytes(p["bytes"])) and p["logprob"] <= 0


def test_streaming_gives_the_same_tokens_and_text_as_non_streaming(client):
    alone = greedy(client, "The world", n=10, cache_prompt=False)
    r = client.post("/completion", json={"prompt": "The world", "n_predict": 10, "temperature": 0,
                                          "stream": True, "cache_prompt": False})
    assert r.headers["content-type"].startswith("text/event-stream")
    events = [json.loads(e) for e in sse_events(r.text)]
    assert "[DONE]" not in r.text                       # llama-server's /completion has no [DONE]
    *chunks, final = events
    assert all(c["stop"] is False for c in chunks) and final["stop"] is True
    assert "".join(c["content"] for c in chunks) == alone["content"]
    assert [t for c in chunks for t in c["tokens"]] == alone["tokens"]
    assert final["tokens_predicted"] == 10 and final["stop_type"] == "limit"


def test_prompt_as_ids_or_mixed_list_equals_the_string_prompt(client, tiny_engine):
    tok = tiny_engine[0].tokenizer
    as_text = greedy(client, "Hello world", cache_prompt=False)["tokens"]
    ids = tok.encode("Hello world", parse_special=True)
    assert greedy(client, ids, cache_prompt=False)["tokens"] == as_text
    mixed = [ids[0]] + ["" + tok.decode(ids[1:])]
    assert greedy(client, mixed, cache_prompt=False)["tokens"] == as_text


def test_stop_string_cuts_the_text_and_reports_the_word(client):
    full = greedy(client, "Hello", n=12)["content"]
    at = next(i for i in range(1, len(full) - 1) if full.find(full[i:i + 2]) == i and "\ufffd" not in full[i:i + 2])
    word = full[at:at + 2]
    out = greedy(client, "Hello", n=12, stop=[word])
    assert out["content"] == full[:at]
    assert (out["stop_type"], out["stopping_word"]) == ("word", word)


@pytest.mark.parametrize("form", ["pairs", "text", "map", "map_text"])
def test_logit_bias_false_forbids_a_token_in_every_form(client, tiny_engine, form):
    tok = tiny_engine[0].tokenizer
    first = greedy(client, "Hello", n=1)["tokens"][0]
    piece = tok.decode([first])
    bias = {"pairs": [[first, False]], "text": [[piece, False]], "map": {str(first): False},
            "map_text": {piece: False}}[form]
    if form.endswith("text") and tok.encode(piece, add_special=False) != [first]:
        pytest.skip("the greedy token's text does not tokenize back to it")
    assert greedy(client, "Hello", n=1, logit_bias=bias)["tokens"][0] != first


def test_positive_logit_bias_forces_a_token(client):
    assert greedy(client, "Hello", n=3, logit_bias=[[42, 100.0]])["tokens"] == [42, 42, 42]


def test_seeded_sampling_is_reproducible(client):
    body = {"prompt": "Hello", "n_predict": 8, "temperature": 1.0, "top_k": 0, "seed": 7, "return_tokens": True}
    a, b = (client.post("/completion", json=body).json() for _ in range(2))
    assert a["tokens"] == b["tokens"] and a["generation_settings"]["seed"] == 7


def test_openai_completion_and_chat_formats(client, tiny_engine):
    n_prompt = len(tiny_engine[0].tokenizer.encode("Hello", parse_special=True))
    r = client.post("/v1/completions", json={"prompt": "Hello", "max_tokens": 4, "temperature": 0, "logprobs": 2})
    body = r.json()
    assert body["id"].startswith("cmpl-") and body["object"] == "text_completion"
    choice = body["choices"][0]
    assert choice["finish_reason"] == "length" and choice["index"] == 0
    assert body["usage"] == {"prompt_tokens": n_prompt, "completion_tokens": 4, "total_tokens": n_prompt + 4}
    lp = choice["logprobs"]
    assert len(lp["tokens"]) == 4 and all(len(t) <= 2 for t in lp["top_logprobs"])
    assert "".join(lp["tokens"]).replace("\ufffd", "") == choice["text"].replace("\ufffd", "")
    msgs = [{"role": "user", "content": "hi"}]
    # the default temperature samples: seeded, and ignore_eos so a random model's early EOG cannot cut it short
    chat = client.post("/v1/chat/completions", json={"messages": msgs, "max_tokens": 3, "seed": 3, "ignore_eos": True,
                                                      "logprobs": True, "top_logprobs": 2, "model": "my-model"}).json()
    assert chat["id"].startswith("chatcmpl-") and chat["object"] == "chat.completion"
    assert chat["model"] == "my-model"
    assert chat["choices"][0]["message"]["role"] == "assistant"
    content = chat["choices"][0]["logprobs"]["content"]
    assert len(content) == 3 and all(len(c["top_logprobs"]) == 2 for c in content)


@pytest.mark.parametrize("logprobs", [None, False])
def test_chat_top_logprobs_without_logprobs_is_a_400_naming_both(client, logprobs):
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1, "top_logprobs": 2}
    if logprobs is not None:
        body["logprobs"] = logprobs
    err = assert_error(client.post("/v1/chat/completions", json=body), 400)
    assert "'top_logprobs' requires 'logprobs': true" in err["message"]
    body["top_logprobs"] = None   # null is "not given", as OpenAI reads it
    assert client.post("/v1/chat/completions", json=body).status_code == 200


def test_openai_stream_ends_with_done_and_carries_usage(client):
    msgs = [{"role": "user", "content": "hi"}]
    r = client.post("/v1/chat/completions", json={"messages": msgs, "max_tokens": 4, "stream": True, "seed": 4,
                                                   "ignore_eos": True, "stream_options": {"include_usage": True}})
    events = sse_events(r.text)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    finish = [c for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
    assert len(finish) == 1 and finish[0]["usage"]["completion_tokens"] == 4
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"] == finish[0]["usage"]
    assert len({c["id"] for c in chunks}) == 1


def test_api_key_required_except_on_public_routes(tiny_engine):
    with make_client(tiny_engine, api_keys=("k1", "secret")) as c:
        err = assert_error(c.post("/tokenize", json={"content": "x"}), 401)
        assert err["message"] == "Invalid API Key"
        assert_error(c.post("/tokenize", json={"content": "x"}, headers={"Authorization": "Bearer nope"}), 401)
        ok = c.post("/tokenize", json={"content": "x"}, headers={"Authorization": "Bearer secret"})
        assert ok.status_code == 200
        assert c.post("/tokenize", json={"content": "x"}, headers={"X-Api-Key": "k1"}).status_code == 200
        assert c.get("/health").status_code == 200 and c.get("/v1/models").status_code == 200


def test_cors_headers_only_with_cors_origin(tiny_engine):
    headers = {"Origin": "http://ui.example"}
    with make_client(tiny_engine) as c:
        assert "access-control-allow-origin" not in c.get("/health", headers=headers).headers
    with make_client(tiny_engine, cors=CorsPolicy(("http://ui.example",))) as c:
        assert c.get("/health", headers=headers).headers["access-control-allow-origin"] == "http://ui.example"
        pre = c.options("/completion", headers={**headers, "Access-Control-Request-Method": "POST"})
        assert pre.status_code == 200


def test_metrics_need_the_flag_and_use_llama_server_names(tiny_engine, client):
    with make_client(tiny_engine) as c:
        assert_error(c.get("/metrics"), 501)
    greedy(client, "Hello", n=2)
    text = client.get("/metrics").text
    for name in ("llamacpp:prompt_tokens_total", "llamacpp:tokens_predicted_total", "llamacpp:requests_processing",
                 "slotserver_time_to_first_token_seconds_count", "slotserver_kv_bytes"):
        assert f"\n{name} " in text or text.startswith(f"{name} "), name
    count = [line for line in text.splitlines() if line.startswith("slotserver_time_to_first_token_seconds_count")]
    assert float(count[0].split()[1]) >= 1


def busy_slots(c: TestClient, prompt: str) -> list[dict]:
    """GET /slots as seen while a request for `prompt` is generating (requests are sent in a loop
    from another thread until a poll catches one in flight: the tiny model is fast)."""
    stop = threading.Event()

    def load() -> None:
        while not stop.is_set():
            c.post("/completion", json={"prompt": prompt, "n_predict": -1, "ignore_eos": True, "temperature": 0})

    worker = threading.Thread(target=load)
    worker.start()
    try:
        deadline = time.time() + 10
        while time.time() < deadline:
            slots = c.get("/slots").json()
            if any(s["is_processing"] for s in slots):
                return slots
        raise AssertionError("no request seen in flight")
    finally:
        stop.set()
        worker.join()


def test_slots_never_show_prompts_unless_slots_debug(tiny_engine):
    secret = "my secret prompt"
    with make_client(tiny_engine) as c:
        assert secret not in json.dumps(busy_slots(c, secret))
    with make_client(tiny_engine, slots_debug=True) as c:
        assert secret in [s.get("prompt") for s in busy_slots(c, secret)]


def test_slots_endpoint_options(tiny_engine):
    with make_client(tiny_engine, slots_endpoint=False) as c:
        assert_error(c.get("/slots"), 501)
    with make_client(tiny_engine) as c:
        assert c.get("/slots?fail_on_no_slot=1").status_code == 200   # idle slots exist
        assert_error(c.post("/slots/0?action=save", json={"filename": "x"}), 501)  # no --slot-save-path


def test_a_slot_is_freed_after_a_finished_request(client):
    greedy(client, "Hello", n=2)
    deadline = time.time() + 2
    while any(s["is_processing"] for s in client.get("/slots").json()):
        assert time.time() < deadline
    assert math.isfinite(client.get("/slots").json()[0]["tokens_per_second"])


class ExplodingEngine:
    """An engine whose submit fails unexpectedly (a bug, not a bad request)."""

    def __init__(self, engine) -> None:
        self.config = engine.config

    def submit(self, request, loop=None):
        raise KeyError("boom")


def test_an_unexpected_error_is_a_logged_500_and_the_server_keeps_serving(tiny_engine, caplog):
    bundle, engine = tiny_engine
    state = ServerState(ServerConfig())
    state.set_loaded(bundle, ExplodingEngine(engine))
    with TestClient(create_app(state), raise_server_exceptions=False) as c:
        r = c.post("/completion", json={"prompt": "hi"})
        assert r.status_code == 500
        assert r.json()["error"]["type"] == "server_error" and "KeyError" in r.json()["error"]["message"]
        assert c.get("/health").json() == {"status": "ok"}
    assert any("boom" in (rec.exc_text or "") for rec in caplog.records), "the traceback is logged"


def test_one_log_line_per_request_with_status_tokens_and_time(client, caplog):
    caplog.set_level("INFO", logger="slotserver.http")
    greedy(client, "Hello", n=3)
    client.get("/nope")
    lines = [rec.getMessage() for rec in caplog.records if rec.name == "slotserver.http"]
    assert [line for line in lines if re.fullmatch(r"POST /completion 200 \d+\+3 tok \d+ ms", line)], lines
    assert [line for line in lines if re.fullmatch(r"GET /nope 404 - tok \d+ ms", line)], lines


def test_chat_input_tokens_count_the_prompt_the_chat_route_runs(client):
    """llama-server's /v1/chat/completions/input_tokens: the same rendering and tokens as the chat
    route (its usage.prompt_tokens), nothing generated; a bad body is the chat route's 400."""
    body = {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hello there"}]}
    n = client.post("/v1/chat/completions/input_tokens", json=body).json()["input_tokens"]
    usage = client.post("/v1/chat/completions", json={**body, "max_tokens": 1, "temperature": 0}).json()["usage"]
    assert n == usage["prompt_tokens"] > 5
    assert client.post("/chat/completions/input_tokens", json=body).json() == {"input_tokens": n}
    assert client.post("/v1/chat/completions/input_tokens", json={"messages": "hi"}).status_code == 400
