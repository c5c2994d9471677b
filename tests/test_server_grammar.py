"""Constrained decoding through HTTP on the default model: `grammar`, `json_schema` and OpenAI's
`response_format` give output that parses and matches, on every completion endpoint, greedy and
seeded; constrained and free requests share batches without changing the free ones' output."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import torch
from openai import OpenAI

from slotserver.engine.masks import unpack_bitmask
from smollm_server import smollm_client

PERSON = {"type": "object", "additionalProperties": False, "required": ["name", "age", "city"],
          "properties": {"name": {"type": "string", "maxLength": 20}, "age": {"type": "integer"},
                         "city": {"type": "string", "enum": ["Paris", "Tokyo", "Lima"]}}}
ASK = [{"role": "user", "content": "Describe a person as JSON with name, age and city."}]


@pytest.fixture(scope="module")
def served():
    with smollm_client() as ce:
        yield ce


@pytest.fixture(scope="module")
def client(served):
    return served[0]


def _valid_person(text: str) -> dict:
    obj = json.loads(text)
    assert set(obj) == {"name", "age", "city"}, obj
    assert isinstance(obj["name"], str) and len(obj["name"]) <= 20
    assert isinstance(obj["age"], int) and obj["city"] in ("Paris", "Tokyo", "Lima")
    return obj


def test_openai_sdk_response_format_json_schema_is_valid_every_time(client):
    oai = OpenAI(base_url="http://testserver/v1", api_key="x", http_client=client)
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}}
    r = oai.chat.completions.create(model="m", messages=ASK, response_format=fmt, seed=0, n=3,   # seeds 0, 1, 2
                                    temperature=1.0, max_tokens=80)                           # side by side
    assert len(r.choices) == 3
    for choice in r.choices:
        assert choice.finish_reason == "stop"
        _valid_person(choice.message.content)


def test_gbnf_grammar_on_completion_ends_when_the_grammar_is_complete(client):
    body = {"prompt": "Is the sky blue? Answer:", "grammar": 'root ::= " " ("yes" | "no") "."', "temperature": 0,
            "n_predict": 50}
    out = client.post("/completion", json=body).json()
    assert out["content"] in (" yes.", " no.") and out["stop_type"] == "eos"
    assert out["tokens_predicted"] < 50


def test_json_schema_field_and_json_object_format_on_every_endpoint(client):
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
              "additionalProperties": False}
    r = client.post("/completion", json={"prompt": "Status as JSON:", "json_schema": schema, "temperature": 0})
    assert isinstance(json.loads(r.json()["content"])["ok"], bool)
    fmt = {"type": "json_object", "schema": schema}
    r = client.post("/v1/completions", json={"prompt": "Status as JSON:", "response_format": fmt, "temperature": 0})
    assert isinstance(json.loads(r.json()["choices"][0]["text"])["ok"], bool)
    r = client.post("/chat/completions", json={"messages": ASK, "response_format": fmt, "seed": 3})
    assert isinstance(json.loads(r.json()["choices"][0]["message"]["content"])["ok"], bool)


def test_streamed_constrained_output_equals_the_whole_answer(client):
    body = {"messages": ASK, "response_format": {"type": "json_schema", "json_schema": {"schema": PERSON}},
            "temperature": 0, "max_tokens": 80}
    whole = client.post("/v1/chat/completions", json=body).json()["choices"][0]["message"]["content"]
    with client.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as r:
        lines = [ln[6:] for ln in r.iter_lines() if ln.startswith("data: ") and ln != "data: [DONE]"]
    streamed = "".join(json.loads(ln)["choices"][0]["delta"].get("content") or "" for ln in lines if json.loads(ln)["choices"])
    assert streamed == whole
    _valid_person(whole)


def test_constrained_and_free_rows_share_a_batch_and_free_output_is_unchanged(client):
    free = {"prompt": "The capital of France is", "temperature": 0, "n_predict": 24}
    alone = client.post("/completion", json=free).json()["content"]
    constrained = {"prompt": "A person:", "json_schema": PERSON, "temperature": 0, "n_predict": 80}
    with ThreadPoolExecutor(4) as pool:
        futs = [pool.submit(client.post, "/completion", json=b) for b in (constrained, free, constrained, free)]
        outs = [f.result().json()["content"] for f in futs]
    assert outs[1] == outs[3] == alone
    assert outs[0] == outs[2]
    _valid_person(outs[0])


def test_invalid_grammar_and_schema_are_400_naming_the_problem(client):
    r = client.post("/completion", json={"prompt": "x", "grammar": "root ::= missing"})
    assert r.status_code == 400 and "missing" in r.json()["error"]["message"]
    bad = {"type": "json_schema", "json_schema": {"schema": {"type": "object", "properties": {"a": {"type": "nope"}}}}}
    r = client.post("/v1/chat/completions", json={"messages": ASK, "response_format": bad})
    assert r.status_code == 400 and "nope" in r.json()["error"]["message"]
    assert client.post("/completion", json={"prompt": "x", "n_predict": 2}).status_code == 200   # still serving


def test_unpack_bitmask_matches_llguidance_bit_order():
    rng = np.random.default_rng(0)
    words = rng.integers(-2**31, 2**31, size=(3, 5), dtype=np.int64).astype(np.int32)
    want = np.unpackbits(words.view(np.uint8), axis=1, bitorder="little")[:, :150].astype(bool)
    got = unpack_bitmask(torch.from_numpy(words), 150)
    assert got.shape == (3, 150) and np.array_equal(got.numpy(), want)
