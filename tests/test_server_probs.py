"""What llama-server's `n_probs` and `post_sampling_probs` report, through HTTP on a tiny model:
the model's own probabilities before bias and samplers, or the sampler chain's final ones."""

from __future__ import annotations

import math

import pytest
from test_server_api import make_client, tiny_engine  # noqa: F401 - the module's engine fixture


@pytest.fixture(scope="module")
def client(tiny_engine):  # noqa: F811
    with make_client(tiny_engine) as c:
        yield c


def _probs(client, **extra) -> list[dict]:
    body = {"prompt": "hello world", "n_predict": 3, "n_probs": 4, "seed": 7, **extra}
    r = client.post("/completion", json=body)
    assert r.status_code == 200, r.text
    return r.json()["completion_probabilities"]


def test_greedy_post_sampling_probs_give_the_chosen_token_probability_one(client):
    for entry in _probs(client, temperature=0, post_sampling_probs=True):
        assert entry["prob"] == pytest.approx(1.0) and "logprob" not in entry
        assert [t["id"] for t in entry["top_probs"]] == [entry["id"]]


def test_n_probs_are_the_models_own_before_bias(client):
    plain = _probs(client, temperature=0)
    banned = plain[0]["id"]   # the greedy first token, banned by a -inf bias: it still shows its probability
    biased = _probs(client, temperature=0, logit_bias=[[banned, False]])
    assert biased[0]["id"] != banned
    top = {t["id"]: t["logprob"] for t in biased[0]["top_logprobs"]}
    assert top[banned] == pytest.approx(plain[0]["top_logprobs"][0]["logprob"], abs=1e-4)
    assert sum(math.exp(t["logprob"]) for t in plain[0]["top_logprobs"]) <= 1 + 1e-6


def test_post_sampling_probs_follow_the_chain(client):
    entries = _probs(client, temperature=1.0, top_k=2, post_sampling_probs=True)
    for e in entries:
        assert 1 <= len(e["top_probs"]) <= 2
        assert sum(t["prob"] for t in e["top_probs"]) == pytest.approx(1.0, abs=1e-5)
        assert e["id"] in [t["id"] for t in e["top_probs"]]


# Issue 32 (5): llama-server answers this with 7 tokens and 7 probability entries, the last the EOS
# token (id 2, text ''); the EOS step was missing from every format. The requests recompute their
# prompt (cache_prompt false), so that each one's floats are the others'.
EOS_PROMPT = "<|im_start|>user\nWhat is 2+2? Answer with one number.<|im_end|>\n<|im_start|>assistant\n"
EOS_ID = 2   # SmolLM2's <|im_end|>


@pytest.fixture(scope="module")
def smollm():
    from smollm_server import smollm_client

    with smollm_client(n_parallel=2) as (c, _):
        yield c


def _sse(r) -> list[dict]:
    import json

    assert r.status_code == 200, r.text
    return [json.loads(b[len("data: "):]) for b in r.text.strip().split("\n\n") if b != "data: [DONE]"]


def _eos_completion(smollm, **extra) -> dict:
    body = {"prompt": EOS_PROMPT, "n_predict": 40, "temperature": 0, "n_probs": 2, "cache_prompt": False, **extra}
    r = smollm.post("/completion", json=body)
    assert r.status_code == 200, r.text
    return r.json()


def test_the_eos_step_is_in_n_probs_as_llama_server_reports_it(smollm):
    out = _eos_completion(smollm, return_tokens=True)
    probs = out["completion_probabilities"]
    assert out["stop_type"] == "eos" and len(probs) == out["tokens_predicted"] == len(out["tokens"])
    eos = probs[-1]
    assert eos["id"] == out["tokens"][-1] == EOS_ID and eos["token"] == "" and eos["bytes"] == []
    assert [t["id"] for t in eos["top_logprobs"]][0] == EOS_ID and len(eos["top_logprobs"]) == 2
    assert eos["logprob"] == eos["top_logprobs"][0]["logprob"] < 0   # greedy: the most probable token
    assert out["content"] == "".join(p["token"] for p in probs) and "<|im_end|>" not in out["content"]


def test_the_eos_step_streams_its_own_chunk_with_its_probabilities(smollm):
    whole = _eos_completion(smollm, return_tokens=True)
    chunks = _sse(smollm.post("/completion", json={"prompt": EOS_PROMPT, "n_predict": 40, "temperature": 0,
                                                   "n_probs": 2, "cache_prompt": False, "stream": True}))
    streamed = [e for c in chunks[:-1] for e in c.get("completion_probabilities", [])]
    assert streamed == whole["completion_probabilities"]
    assert chunks[-2]["tokens"] == [EOS_ID] and chunks[-2]["content"] == ""
    assert [t for c in chunks for t in c["tokens"]] == whole["tokens"]
    assert chunks[-1]["stop"] is True and chunks[-1]["tokens_predicted"] == whole["tokens_predicted"]


def test_openai_completions_logprobs_end_with_the_eos_step(smollm):
    whole = _eos_completion(smollm)["completion_probabilities"]
    body = {"prompt": EOS_PROMPT, "max_tokens": 40, "temperature": 0, "logprobs": 2, "cache_prompt": False}
    out = smollm.post("/v1/completions", json=body).json()
    lp, text = out["choices"][0]["logprobs"], out["choices"][0]["text"]
    assert len(lp["tokens"]) == out["usage"]["completion_tokens"] == len(whole)
    assert lp["tokens"][-1] == "" and "".join(lp["tokens"]) == text
    assert lp["token_logprobs"] == pytest.approx([e["logprob"] for e in whole], abs=1e-6)
    chunks = _sse(smollm.post("/v1/completions", json={**body, "stream": True}))
    streamed = [c["choices"][0]["logprobs"] for c in chunks if c["choices"] and c["choices"][0]["logprobs"]]
    assert [t for s in streamed for t in s["tokens"]] == lp["tokens"]
    assert [x for s in streamed for x in s["token_logprobs"]] == lp["token_logprobs"]


def test_openai_chat_logprobs_end_with_the_eos_step(smollm):
    body = {"messages": [{"role": "user", "content": "What is 2+2? Answer with one number."}], "max_tokens": 40,
            "temperature": 0, "logprobs": True, "top_logprobs": 2, "cache_prompt": False}
    out = smollm.post("/v1/chat/completions", json=body).json()
    content = out["choices"][0]["logprobs"]["content"]
    assert out["choices"][0]["finish_reason"] == "stop" and len(content) == out["usage"]["completion_tokens"]
    assert content[-1]["token"] == "" and content[-1]["bytes"] == [] and len(content[-1]["top_logprobs"]) == 2
    assert "".join(c["token"] for c in content) == out["choices"][0]["message"]["content"]
    chunks = _sse(smollm.post("/v1/chat/completions", json={**body, "stream": True}))
    streamed = [e for c in chunks if c["choices"] and c["choices"][0]["logprobs"]
                for e in c["choices"][0]["logprobs"]["content"]]
    assert streamed == content
