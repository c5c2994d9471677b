"""The reasoning budget through HTTP (server/budget_fields.py; the state machine:
test_reasoning_budget.py), on the tiny random model at temperature 0.

The chat template opens `<think>\\n` in its generation prompt, so counting starts with the first
generated token. Each check compares against the same request without a budget (the reference):
the first N tokens agree, then the forced message and `</think>` (several tokens each in the tiny
byte-level vocabulary), then the model answers on. The tiny model's first tokens are lone UTF-8
lead bytes (then an ASCII `R` at index 7), which makes the UTF-8 wait visible.
"""

from __future__ import annotations

import json

import pytest
from starlette.testclient import TestClient
from test_server_api import assert_error, sse_events
from test_server_cli import parse, run_cli
from test_server_reasoning import THINKING
from tiny_engine import running_tiny_engine

from slotserver.engine.reasoning_budget import utf8_complete
from slotserver.model.text.chat_template import CHATML_TEMPLATE, ChatTemplate
from slotserver.server import ServerConfig, ServerState, create_app
from slotserver.server.config import GenerationDefaults
from slotserver.server.config_from_args import server_config_from_args
from slotserver.server.reasoning import WS

ASK = [{"role": "user", "content": "Capital of France?"}]
TAGS = {"reasoning_budget_start_tag": "<think>", "reasoning_budget_end_tags": ["</think>"]}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    with running_tiny_engine(tmp_path_factory.mktemp("budget"), 2, 512) as running:
        yield running


def serve(tiny, template: str = THINKING, **defaults) -> TestClient:
    bundle, engine = tiny
    state = ServerState(ServerConfig(model_path=str(bundle.config.model_path), defaults=GenerationDefaults(**defaults)))
    state.set_loaded(bundle, engine, ChatTemplate(template))
    return TestClient(create_app(state))


@pytest.fixture(scope="module")
def client(tiny):
    with serve(tiny) as c:
        yield c


def chat(client, **extra) -> tuple[dict, list[dict]]:
    body = {"messages": ASK, "temperature": 0, "max_tokens": 30, "logprobs": True, **extra}
    r = client.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    return choice["message"], choice["logprobs"]["content"]


def pieces(entries: list[dict]) -> list[list[int]]:
    return [e["bytes"] for e in entries]


def text(entries: list[dict]) -> str:
    return bytes(b for e in entries for b in e["bytes"]).decode("utf-8", "replace")


def forced_bytes(tiny, message: str, end: str = "</think>") -> list[list[int]]:
    tok = tiny[0].tokenizer
    ids = [*tok.encode(message, False, True), *tok.encode(end, False, True)]
    return [list(tok.token_bytes(t)) for t in ids]


@pytest.fixture(scope="module")
def reference(client) -> list[dict]:
    message, entries = chat(client)
    assert "content" in message and not message["content"] and len(entries) == 30   # thinks all along
    return entries


@pytest.mark.parametrize("message", ["", " Enough."])
def test_n_tokens_then_message_and_end_then_the_answer(tiny, client, reference, message):
    assert utf8_complete(bytes(reference[7]["bytes"]))        # the 8th token ends a character: no wait
    got, entries = chat(client, reasoning_budget_tokens=8, reasoning_budget_message=message)
    forced = forced_bytes(tiny, message)
    assert pieces(entries[:8]) == pieces(reference[:8])
    assert pieces(entries[8:8 + len(forced)]) == forced
    answer = entries[8 + len(forced):]
    assert answer and got["reasoning_content"] == (text(reference[:8]) + message).strip(WS)
    assert got["content"] == text(answer).lstrip(WS) and got["content"]


def test_the_forced_end_waits_for_a_whole_utf8_character(tiny, client, reference):
    assert not utf8_complete(bytes(reference[4]["bytes"]))    # budget 5 ends inside a character
    k = next(i for i in range(4, 30) if utf8_complete(bytes(reference[i]["bytes"]))) + 1
    assert k > 5
    got, entries = chat(client, reasoning_budget_tokens=5)
    assert pieces(entries[:k]) == pieces(reference[:k])
    assert pieces(entries[k:k + 7]) == forced_bytes(tiny, "") and got["reasoning_content"] == text(reference[:k])


def test_budget_zero_ends_the_block_at_once(tiny, client):
    got, entries = chat(client, reasoning_budget_tokens=0)
    end = forced_bytes(tiny, "")
    assert pieces(entries[:len(end)]) == end and "reasoning_content" not in got
    assert got["content"] == text(entries[len(end):]).lstrip(WS) and got["content"]


def test_streamed_deltas_add_up_to_the_same_answer(client):
    whole, _ = chat(client, reasoning_budget_tokens=8, reasoning_budget_message=" Enough.")
    body = {"messages": ASK, "temperature": 0, "max_tokens": 30, "stream": True, "reasoning_budget_tokens": 8,
            "reasoning_budget_message": " Enough."}
    events = sse_events(client.post("/v1/chat/completions", json=body).text)
    deltas = [json.loads(e)["choices"][0]["delta"] for e in events[:-1] if json.loads(e)["choices"]]
    assert "".join(d.get("reasoning_content") or "" for d in deltas) == whole["reasoning_content"]
    assert "".join(d.get("content") or "" for d in deltas) == whole["content"]


def test_forced_tokens_report_llama_cpp_s_probabilities(tiny, client):
    """Default: the model's raw distribution (the forced token is rarely its choice); with
    post_sampling_probs the chain's, after the mask: the forced token alone, p = 1."""
    n = len(forced_bytes(tiny, ""))
    _, raw = chat(client, reasoning_budget_tokens=0, top_logprobs=3)
    assert all(e["logprob"] <= e["top_logprobs"][0]["logprob"] for e in raw[:n])
    assert any(e["logprob"] < -1 and e["top_logprobs"][0]["bytes"] != e["bytes"] for e in raw[:n])
    _, post = chat(client, reasoning_budget_tokens=0, top_logprobs=3, post_sampling_probs=True)
    assert pieces(post[:n]) == pieces(raw[:n])
    assert all(e["logprob"] == 0 and pieces(e["top_logprobs"]) == [e["bytes"]] for e in post[:n])


def test_the_server_default_and_the_aliases(tiny):
    with serve(tiny, reasoning_budget=8, reasoning_budget_message=" Enough.") as c:
        default = chat(c)[0]["reasoning_content"]
        assert default.endswith("R Enough.")
        assert chat(c, reasoning_budget_tokens=-1)[0]["reasoning_content"] == default   # -1: the default
        assert chat(c, reasoning_budget_message=" Stop.")[0]["reasoning_content"].endswith("R Stop.")
        assert chat(c, thinking_budget_tokens=0)[0]["reasoning_content"] == "Enough."   # forced at once
        assert chat(c, thinking_budget_tokens=0, reasoning_budget_tokens=8)[0]["reasoning_content"] == default


def test_a_template_without_a_think_block_gets_no_budget(tiny):
    with serve(tiny, CHATML_TEMPLATE, reasoning_budget=0) as c:
        assert pieces(chat(c)[1]) == pieces(chat(c, reasoning_budget_tokens=-1)[1])   # nothing forced
        # with the request's own tags the model would have to write <think> first: it does not here
        assert pieces(chat(c, **TAGS)[1]) == pieces(chat(c, reasoning_budget_tokens=-1)[1])


GRAMMAR = 'root ::= "<think>" [a-z ]* "</think>" [a-z ]*'


def completion(client, **extra) -> dict:
    body = {"prompt": "hello", "temperature": 0, "n_predict": 30, "return_tokens": True, **extra}
    r = client.post("/completion", json=body)
    assert r.status_code == 200, r.text
    return r.json()


def test_completion_with_its_own_tags_counts_after_the_generated_start_tag(tiny, client):
    tok = tiny[0].tokenizer
    start, forced = tok.encode("<think>", False, True), tok.encode("stop</think>", False, True)
    free = completion(client, grammar=GRAMMAR)
    assert free["tokens"][:len(start)] == start and "</think>" not in free["content"]
    got = completion(client, grammar=GRAMMAR, reasoning_budget_tokens=3, reasoning_budget_message="stop", **TAGS)
    n = len(start) + 3
    assert got["tokens"][:n] == free["tokens"][:n] and got["tokens"][n:n + len(forced)] == forced
    assert got["content"].startswith(tok.decode(free["tokens"][:n]) + "stop</think>")


def test_a_block_that_ends_within_its_budget_is_left_alone(client):
    """`ab` and the 7 tokens of `</think>` fit a budget of 10 (an end tag's tokens count until it is
    whole); were the end missed, the 10th token would force `x</think>`, which the grammar forbids."""
    grammar = 'root ::= "<think>ab</think>" [a-z ]*'
    free = completion(client, grammar=grammar)
    got = completion(client, grammar=grammar, reasoning_budget_tokens=10, reasoning_budget_message="x", **TAGS)
    assert (got["tokens"], got["content"]) == (free["tokens"], free["content"])
    assert len(free["tokens"]) == 30


@pytest.mark.parametrize("path,body,named", [
    ("/v1/chat/completions", {"reasoning_budget_tokens": -2}, "reasoning_budget_tokens"),
    ("/v1/chat/completions", {"thinking_budget_tokens": "8"}, "thinking_budget_tokens"),
    ("/v1/chat/completions", {"reasoning_budget_message": 3}, "reasoning_budget_message"),
    ("/v1/chat/completions", {"reasoning_budget_end_tags": "</think>"}, "reasoning_budget_end_tags"),
    ("/completion", {"reasoning_budget_tokens": 8}, "reasoning_budget_start_tag"),
    ("/completion", {"reasoning_budget_tokens": 8, "reasoning_budget_start_tag": "<think>"}, "end_tags"),
    ("/completion", {"thinking_budget_tokens": 8}, "thinking_budget_tokens"),
    ("/completion", {"reasoning_budget_start_tag": ["<think>"]}, "reasoning_budget_start_tag"),
    ("/v1/completions", {"reasoning_budget_tokens": 2.5, **TAGS}, "reasoning_budget_tokens"),
])
def test_bad_budget_fields_are_400_naming_them(client, path, body, named):
    base = {"messages": ASK} if "chat" in path else {"prompt": "hi"}
    err = assert_error(client.post(path, json={**base, "max_tokens": 2, **body}), 400)
    assert named in err["message"]


def test_the_flags_reach_the_defaults_and_bad_ones_stop_the_server(capsys):
    d = server_config_from_args(parse("--reasoning-budget", "64", "--reasoning-budget-message", " Done.")).defaults
    assert (d.reasoning_budget, d.reasoning_budget_message) == (64, " Done.")
    assert server_config_from_args(parse()).defaults.reasoning_budget == -1
    status, lines = run_cli(capsys, "--reasoning-budget", "-2")
    assert status == 2 and len(lines) == 1 and "--reasoning-budget" in lines[0], lines
