"""A decoder reranker (Qwen3-Reranker as llama.cpp's converter writes it: qwen3 with rank pooling, a
`cls.output` "yes"/"no" head and a rerank template) served by `--reranking` gives llama-server's scores
(tests/fixtures/rerank/qwen3-reranker.gguf/.json, playground/make_decoder_reranker_fixture.py): the
last token's final-normed state through the head, then a softmax."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from embed_server import embedding_client
from slotserver.model.model import LlamaModel

RERANKER = Path(__file__).parent / "fixtures" / "rerank" / "qwen3-reranker.gguf"
RECORDED = json.loads(RERANKER.with_suffix(".json").read_text())


def test_rerank_scores_are_llama_servers():
    with embedding_client(rerank=True, path=RERANKER) as client:
        r = client.post("/v1/rerank", json={"query": RECORDED["query"], "documents": RECORDED["documents"]})
        assert r.status_code == 200, r.text
        got = sorted(r.json()["results"], key=lambda x: x["index"])
        assert [x["relevance_score"] for x in got] == pytest.approx(RECORDED["scores"], abs=1e-5)
        assert r.json()["usage"]["prompt_tokens"] == RECORDED["prompt_tokens"]
        best = r.json()["results"][0]["index"]   # sorted best first
        assert RECORDED["scores"][best] == max(RECORDED["scores"])


def test_the_file_still_loads_for_generation_its_head_is_the_embedders():
    """Generation loads it (llama.cpp's qwen3 creates cls_out as optional): the head is not a tensor
    the generator leaves unread."""
    model = LlamaModel.load(RERANKER)
    assert model.spec.arch == "qwen3"
