"""Bad requests get the right status and llama-server's JSON error shape, never a 500, and the
server keeps serving: a fixed battery, then random JSON bodies (hypothesis) in-process on a tiny
model with 32-cell slots (so even a valid random request generates at most a few dozen tokens).
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from test_server_api import assert_error, make_client
from tiny_engine import running_tiny_engine

N_CELLS = 32
MSGS = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def tiny_engine(tmp_path_factory):
    with running_tiny_engine(tmp_path_factory.mktemp("tiny"), 2, 2 * N_CELLS) as running:
        yield running


@pytest.fixture(scope="module")
def client(tiny_engine, tmp_path_factory):
    save = tmp_path_factory.mktemp("slots")
    with make_client(tiny_engine, slot_save_path=save, body_limit=64 * 1024) as c:
        yield c


def completion(**fields) -> dict:
    return {"prompt": "hi", "n_predict": 2, **fields}


BAD_COMPLETIONS = {
    "prompt missing": {"n_predict": 2},
    "prompt a number": completion(prompt=5),
    "prompt empty list": completion(prompt=[]),
    "prompt empty string": completion(prompt=""),
    "prompt id out of vocab": completion(prompt=[999999]),
    "prompt negative id": completion(prompt=[-1]),
    "prompt float id": completion(prompt=[1.5]),
    "a prompt list holding a float": completion(prompt=["a", 5.5]),
    "a prompt object without its string": completion(prompt={"text": "a"}),
    "a multimodal prompt": completion(prompt={"prompt_string": "a", "multimodal_data": ["AAAA"]}),
    "n_cmpl above the slots": completion(n_cmpl=3),
    "n_predict a string": completion(n_predict="5"),
    "n_predict a bool": completion(n_predict=True),
    "n_predict fractional": completion(n_predict=1.5),
    "n_predict negative": completion(n_predict=-5),
    "n_predict huge": completion(n_predict=2**40),
    "temperature a string": completion(temperature="hot"),
    "top_p above 1": completion(top_p=1.5),
    "min_p negative": completion(min_p=-0.1),
    "top_k huge": completion(top_k=10**20),
    "repeat_penalty zero": completion(repeat_penalty=0),
    "repeat_last_n below -1": completion(repeat_last_n=-2),
    "seed below -1": completion(seed=-2),
    "seed huge": completion(seed=2**40),
    "n_probs too many": completion(n_probs=101),
    "stop not strings": completion(stop=[1]),
    "logit_bias a string": completion(logit_bias="x"),
    "logit_bias out of vocab": completion(logit_bias=[[999999, 1.0]]),
    "logit_bias bias a string": completion(logit_bias=[[1, "a"]]),
    "logit_bias bias true": completion(logit_bias=[[1, True]]),
    "logit_bias bias huge": completion(logit_bias=[[1, 1e300]]),
    "logit_bias forbids every token": completion(logit_bias=[[t, False] for t in range(310)]),
    "every token but end-of-generation forbidden, and ignore_eos":
        completion(logit_bias=[[t, False] for t in range(307)] + [[308, False]], ignore_eos=True),
    "repeat_penalty tiny": completion(repeat_penalty=1e-87),
    "id_slot unknown": completion(id_slot=9),
    "id_slot below -1": completion(id_slot=-2),
    "stream a string": completion(stream="yes"),
    "grammar with an undefined rule": completion(grammar="root ::= foo"),
    "grammar not a string": completion(grammar=5),
    "grammar empty": completion(grammar="  "),
    "json_schema not an object": completion(json_schema="x"),
    "json_schema with an unknown type": completion(json_schema={"type": "nope"}),
    "grammar and json_schema": completion(grammar="root ::= \"a\"", json_schema={"type": "object"}),
    "response_format unknown type": completion(response_format={"type": "yaml"}),
}

BAD_CHATS = {
    "messages missing": {"max_tokens": 2},
    "messages a string": {"messages": "hi"},
    "message without content": {"messages": [{"role": "user"}]},
    "content a number": {"messages": [{"role": "user", "content": 5}]},
    "n above the slots": {"messages": MSGS, "n": 3},
    "n zero": {"messages": MSGS, "n": 0},
    "max_tokens zero": {"messages": MSGS, "max_tokens": 0},
    "logprobs a string": {"messages": MSGS, "logprobs": "yes"},
    "top_logprobs too many": {"messages": MSGS, "logprobs": True, "top_logprobs": 21},
    "tools not functions": {"messages": MSGS, "tools": [{"type": "retrieval"}]},
    "tool_choice naming no tool": {"messages": MSGS, "tools": [{"type": "function", "function": {"name": "f"}}],
                                   "tool_choice": {"type": "function", "function": {"name": "g"}}},
    "response_format a string": {"messages": MSGS, "response_format": "json"},
    "response_format json_schema without its object": {"messages": MSGS, "response_format": {"type": "json_schema"}},
    "response_format bad schema": {"messages": MSGS, "response_format": {
        "type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object", "required": 5}}}},
    "response_format strict not a bool": {"messages": MSGS, "response_format": {
        "type": "json_schema", "json_schema": {"name": "x", "schema": {}, "strict": "yes"}}},
    "stream_options a string": {"messages": MSGS, "stream": True, "stream_options": "x"},
    "two assistant messages at the end": {"messages": MSGS + [{"role": "assistant", "content": "a"}] * 2},
    "continue_final_message with add_generation_prompt": {
        "messages": MSGS + [{"role": "assistant", "content": "a"}], "continue_final_message": True,
        "add_generation_prompt": True},
    "continue_final_message a number": {"messages": MSGS, "continue_final_message": 1},
}


@pytest.mark.parametrize("body", BAD_COMPLETIONS.values(), ids=BAD_COMPLETIONS.keys())
def test_bad_completion_parameters_are_400(client, body):
    assert_error(client.post("/completion", json=body), 400)


@pytest.mark.parametrize("path, body", [
    ("/completion", completion(prompt=[1] * (N_CELLS + 5))),
    ("/completion", completion(prompt=[1] * (N_CELLS + 5), stream=True)),
    ("/completion", completion(prompt="word " * 10000)),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "word " * 200}], "stream": True}),
])
def test_a_prompt_over_the_slot_context_is_llama_servers_exceed_context_size_error(client, path, body):
    r = client.post(path, json=body)
    err = r.json()["error"]
    assert r.status_code == 400 and err["type"] == "exceed_context_size_error"
    assert err["n_ctx"] == N_CELLS and err["n_prompt_tokens"] > N_CELLS
    assert "exceeds the available context size" in err["message"]


@pytest.mark.parametrize("body", BAD_CHATS.values(), ids=BAD_CHATS.keys())
def test_bad_chat_parameters_are_400(client, body):
    assert_error(client.post("/v1/chat/completions", json=body), 400)


@pytest.mark.parametrize("path, body", [
    ("/v1/completions", {"prompt": "hi", "echo": True}),
    ("/v1/completions", {"prompt": "hi", "best_of": 3}),
    ("/v1/completions", {"prompt": "hi", "logprobs": -1}),
    ("/tokenize", {"content": 5}),
    ("/tokenize", {"content": "x", "with_pieces": "yes"}),
    ("/detokenize", {"tokens": [999999]}),
    ("/detokenize", {"tokens": "x"}),
    ("/apply-template", {"messages": [{"content": "no role"}]}),
])
def test_bad_parameters_on_other_routes_are_400(client, path, body):
    assert_error(client.post(path, json=body), 400)


@pytest.mark.parametrize("content, headers", [
    (b"{", {}),
    (b"[1, 2]", {}),
    (b"null", {}),
    (b"", {}),
    (b'{"prompt": "hi", "temperature": NaN}', {}),
    (b'{"prompt": "\xff\xfe"}', {}),
    (b'{"prompt": "a\\ud800b", "messages": [{"role": "user", "content": "\\udc00"}], "content": "\\ud800"}', {}),
    (b"[" * 50000, {}),
    (b"prompt: hi", {"content-type": "text/plain"}),  # any type is read as JSON (test_server_security)
    (b"prompt=hi", {"content-type": "application/x-www-form-urlencoded"}),
], ids=["truncated", "array", "null", "empty", "NaN", "bad utf-8", "lone surrogate", "deep nesting",
        "text/plain", "form"])
def test_malformed_bodies_are_400(client, content, headers):
    headers = {"content-type": "application/json", **headers}
    for path in ("/completion", "/v1/chat/completions", "/tokenize"):
        assert_error(client.post(path, content=content, headers=headers), 400)


def test_bodies_over_the_limit_are_413(client):
    big = b'{"prompt": "' + b"a" * (65 * 1024) + b'"}'
    assert_error(client.post("/completion", content=big, headers={"content-type": "application/json"}), 413)

    def chunks():  # no Content-Length: the limit is enforced while reading
        yield b'{"prompt": "'
        for _ in range(100):
            yield b"a" * 1024
        yield b'"}'

    r = client.post("/completion", content=chunks(), headers={"content-type": "application/json"})
    assert_error(r, 413)


@pytest.mark.parametrize("method, path, status", [
    ("GET", "/completion", 405), ("PUT", "/v1/chat/completions", 405), ("DELETE", "/health", 405),
    ("GET", "/nope", 404), ("POST", "/v2/completions", 404),
])
def test_wrong_methods_and_routes(client, method, path, status):
    assert_error(client.request(method, path), status)


@pytest.mark.parametrize("url, body", [
    ("/slots/abc?action=save", {"filename": "a.bin"}),
    ("/slots/0?action=explode", {"filename": "a.bin"}),
    ("/slots/0?action=save", {}),
    ("/slots/0?action=save", {"filename": "../evil"}),
    ("/slots/0?action=restore", {"filename": "/etc/passwd"}),
    ("/slots/0?action=save", {"filename": ".hidden"}),
    ("/slots/7?action=erase", {}),
])
def test_bad_slot_actions_are_400(client, url, body):
    assert_error(client.post(url, json=body), 400)


def test_unknown_fields_are_ignored(client):
    r = client.post("/completion", json=completion(foo={"bar": [1, 2]}, chat_template="{{ 'x' }}"))
    assert r.status_code == 200 and r.json()["tokens_predicted"] == 2


json_scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) \
    | st.text(max_size=20)


def json_containers(inner: st.SearchStrategy) -> st.SearchStrategy:
    return st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4)


json_values = st.recursive(json_scalars, json_containers, max_leaves=10)
floats = st.floats(allow_nan=False, allow_infinity=False)
PLAUSIBLE = {  # near or across each field's valid range, so many random requests are served
    "n_predict": st.integers(-3, 40), "max_tokens": st.integers(-1, 40), "temperature": floats,
    "top_k": st.integers(-5, 400), "top_p": st.floats(-0.2, 1.2), "min_p": st.floats(-0.2, 1.2),
    "repeat_penalty": st.floats(-0.5, 3), "repeat_last_n": st.integers(-3, 100),
    "presence_penalty": st.floats(-2, 2), "frequency_penalty": st.floats(-2, 2), "seed": st.integers(-3, 2**33),
    "stop": st.lists(st.text(max_size=3), max_size=3), "ignore_eos": st.booleans(),
    "logit_bias": st.lists(st.tuples(st.integers(-5, 400), floats | st.just(False)).map(list), max_size=3),
    "n_probs": st.integers(-1, 120), "cache_prompt": st.booleans(), "id_slot": st.integers(-2, 3),
    "n_keep": st.integers(-2, 5), "stream": st.booleans(), "return_tokens": st.booleans(), "n": st.integers(0, 3),
    "logprobs": st.booleans() | st.integers(-1, 25), "top_logprobs": st.integers(-1, 25),
    "stream_options": st.fixed_dictionaries({"include_usage": st.booleans()}),
}
PROMPTS = st.sampled_from(["hi", "Hello world", [1, 2, 3], ["a", 5], "<|im_start|>x"])
anything = {name: json_values for name in PLAUSIBLE}
bodies = st.fixed_dictionaries({"prompt": PROMPTS, "messages": st.just(MSGS)}, optional=PLAUSIBLE) \
    | st.fixed_dictionaries({}, optional={"prompt": json_values, "messages": json_values, **anything}) \
    | json_values


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(body=bodies, path=st.sampled_from(["/completion", "/v1/chat/completions", "/v1/completions"]))
def test_random_bodies_never_get_a_server_error(client, body, path):
    r = client.post(path, json=body)
    event(f"status {r.status_code}")
    assert r.status_code in (200, 400), (r.status_code, r.text[:300])
    if r.status_code == 400:
        assert_error(r, 400)


def test_the_server_still_serves_after_all_that(client):
    assert client.get("/health").json() == {"status": "ok"}
    # ignore_eos: the tiny random model may pick its end token first, which is not what this checks
    r = client.post("/v1/chat/completions", json={"messages": MSGS, "max_tokens": 3, "ignore_eos": True})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3, r.json()
