"""`-sp/--special`: control tokens' text in answers and in their probabilities, as llama-server
(server-context.cpp: token_to_piece with params.special, the end token's text included); without
it a control token is '' everywhere, its candidates' texts too. Through HTTP on a tiny model whose
<|im_start|> and <|im_end|> (the end of generation) are control tokens."""

from __future__ import annotations

import json

import pytest
from test_server_api import make_client, sse_events, tiny_engine  # noqa: F401 - the module's engine fixture
from test_server_cli import parse

from slotserver.server.config import GenerationDefaults
from slotserver.server.config_from_args import server_config_from_args


@pytest.fixture(scope="module")
def clients(tiny_engine):  # noqa: F811
    tok = tiny_engine[0].tokenizer
    with make_client(tiny_engine) as plain, make_client(tiny_engine, defaults=GenerationDefaults(special=True)) as sp:
        yield plain, sp, tok.token_to_id("<|im_start|>"), tok.token_to_id("<|im_end|>")


def forced(client, token: int, path: str = "/completion", **extra) -> dict:
    """A greedy answer whose every token is `token` (a +100 bias), with post-sampling probabilities."""
    body = {"prompt": "hello world", "n_predict": 2, "temperature": 0, "seed": 3, "logit_bias": [[token, 100]],
            "n_probs": 2, "post_sampling_probs": True, "cache_prompt": False, **extra}
    r = client.post(path, json=body)
    assert r.status_code == 200, r.text
    return r.json()


def test_a_control_token_is_text_only_with_special(clients):
    plain, sp, start, _ = clients
    a, b = forced(plain, start), forced(sp, start)
    assert a["tokens"] == b["tokens"] == [] and a["tokens_predicted"] == b["tokens_predicted"] == 2
    assert (a["content"], b["content"]) == ("", "<|im_start|><|im_start|>")
    assert [(p["token"], p["top_probs"][0]["token"]) for p in a["completion_probabilities"]] == [("", "")] * 2
    assert [(p["token"], p["top_probs"][0]["token"]) for p in b["completion_probabilities"]] == \
        [("<|im_start|>", "<|im_start|>")] * 2
    assert b["completion_probabilities"][0]["bytes"] == list(b"<|im_start|>")


def test_the_end_token_ends_the_answer_with_its_text(clients):
    plain, sp, _, end = clients
    a, b = forced(plain, end), forced(sp, end)
    assert (a["content"], b["content"]) == ("", "<|im_end|>")
    assert a["stop_type"] == b["stop_type"] == "eos" and b["tokens_predicted"] == 1
    chunks = [json.loads(e) for e in sse_events(sp.post("/completion", json={
        "prompt": "hello world", "n_predict": 4, "temperature": 0, "logit_bias": [[end, 100]], "stream": True}).text)]
    assert "".join(c["content"] for c in chunks) == "<|im_end|>" and chunks[-1]["stop_type"] == "eos"


def test_a_stop_string_can_match_the_end_tokens_text(clients):
    """The word is cut and named; the end is still the end token's (llama-server: STOP_TYPE_EOS)."""
    _, sp, _, end = clients
    b = forced(sp, end, stop=["_end|>"])
    assert (b["content"], b["stop_type"], b["stopping_word"]) == ("<|im", "eos", "_end|>")


def test_openai_logprobs_follow_the_flag(clients):
    plain, sp, start, _ = clients
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1, "temperature": 0,
            "logit_bias": {str(start): 100}, "logprobs": True, "top_logprobs": 1, "seed": 3}
    a, b = (c.post("/v1/chat/completions", json=body).json()["choices"][0] for c in (plain, sp))
    assert (a["message"]["content"], b["message"]["content"]) == ("", "<|im_start|>")
    assert a["logprobs"]["content"][0]["token"] == "" and b["logprobs"]["content"][0]["token"] == "<|im_start|>"


def test_the_flag_reaches_the_servers_defaults():
    assert server_config_from_args(parse("-sp")).defaults.special
    assert not server_config_from_args(parse()).defaults.special
