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
