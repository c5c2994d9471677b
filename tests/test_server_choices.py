"""Several answers per request: prompt lists and `n` choices (llama-server's n_cmpl), on a tiny
model, flat and paged KV. The strongest check: choice j of a seeded request is exactly the single
request with seed + j, so the sibling that copied its parent's prompt KV samples from the same
logits it would have computed itself."""

from __future__ import annotations

import json

import pytest
import torch

from slotserver.engine.config import EngineConfig
from slotserver.engine.engine import Engine
from slotserver.model.bundle import ModelBundle
from slotserver.model.config import ModelConfig
from test_server_api import make_client, sse_events
from tiny_gguf import write_tiny_gguf

PROMPT = "the quick brown fox jumps over the lazy dog and then"


@pytest.fixture(scope="module", params=["seq_head_dim", "paged"])
def client(request, tmp_path_factory):
    threads = torch.get_num_threads()
    path = write_tiny_gguf(tmp_path_factory.mktemp("tiny") / "tiny.gguf")
    bundle = ModelBundle.load(ModelConfig(path, threads=1, layout=request.param))
    engine = Engine(bundle, EngineConfig(n_parallel=4, ctx_size=4 * 128)).start()
    with make_client((bundle, engine)) as c:
        yield c
    engine.stop()
    torch.set_num_threads(threads)


def completion(client, **body) -> dict | list:
    r = client.post("/completion", json={"n_predict": 12, "cache_prompt": False, **body})
    assert r.status_code == 200, r.text
    return r.json()


def test_choice_j_equals_the_single_request_with_seed_plus_j(client):
    many = completion(client, prompt=PROMPT, n_cmpl=3, seed=7, temperature=1.5, return_tokens=True)
    assert [a["index"] for a in many] == [0, 1, 2]
    for j, answer in enumerate(many):
        alone = completion(client, prompt=PROMPT, seed=7 + j, temperature=1.5, return_tokens=True)
        assert answer["tokens"] == alone["tokens"] and answer["content"] == alone["content"]
    assert len({tuple(a["tokens"]) for a in many}) > 1      # the choices differ
    n = many[0]["tokens_evaluated"]
    assert [a["tokens_cached"] for a in many[1:]] == [n - 1, n - 1]   # siblings copied the prefill


def test_prompt_lists_answer_an_array_in_order(client):
    ids = client.post("/tokenize", json={"content": PROMPT, "add_special": True}).json()["tokens"]
    single = completion(client, prompt=PROMPT, temperature=0)
    many = completion(client, prompt=[ids, PROMPT, {"prompt_string": PROMPT}, "other words"], temperature=0)
    assert [a["index"] for a in many] == [0, 1, 2, 3]
    assert many[0]["content"] == many[1]["content"] == many[2]["content"] == single["content"]
    assert many[3]["prompt"] != many[0]["prompt"]
    mixed = completion(client, prompt=[1, 2, PROMPT, 3], temperature=0)       # ids and text: ONE prompt
    assert isinstance(mixed, dict)


def test_openai_completions_prompts_times_n_choices(client):
    r = client.post("/v1/completions", json={"prompt": [PROMPT, "other words"], "n": 2, "max_tokens": 6,
                                             "temperature": 0}).json()
    texts = {c["index"]: c["text"] for c in r["choices"]}
    assert sorted(texts) == [0, 1, 2, 3] and texts[0] == texts[1] and texts[2] == texts[3]
    alone = [client.post("/v1/completions", json={"prompt": p, "max_tokens": 1}).json()["usage"]["prompt_tokens"]
             for p in (PROMPT, "other words")]
    assert r["usage"]["prompt_tokens"] == sum(alone)       # counted once per prompt, not per choice
    assert r["usage"]["completion_tokens"] == 4 * 6


def test_chat_n_streamed_equals_whole_per_choice(client):
    body = {"messages": [{"role": "user", "content": PROMPT}], "n": 2, "seed": 3, "temperature": 1.0,
            "max_tokens": 10}
    whole = client.post("/v1/chat/completions", json=body).json()
    assert [c["index"] for c in whole["choices"]] == [0, 1]
    r = client.post("/v1/chat/completions", json={**body, "stream": True,
                                                  "stream_options": {"include_usage": True}})
    events = sse_events(r.text)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    text, finish = {0: "", 1: ""}, {}
    for ch in chunks:
        for c in ch["choices"]:
            text[c["index"]] += c["delta"].get("content") or ""
            finish[c["index"]] = c["finish_reason"] or finish.get(c["index"])
    assert [text[i] for i in (0, 1)] == [c["message"]["content"] for c in whole["choices"]]
    assert finish == {0: "length", 1: "length"}
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 20
