"""ModernBERT (`modern-bert`: pre-norm layers, NEOX rotary q/k with a global and a windowed base,
symmetric windows on two of three layers, GEGLU) against llama-server's recorded /embeddings on a
tiny random model of it (tests/fixtures/embed/modern-bert.gguf/.json, playground/make_modern_bert_fixture.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from embed_server import embedding_client, load_worker
from slotserver.errors import ConfigError, GGUFError
from slotserver.model.encoder.pooling import normalize
from slotserver.model.model import LlamaModel

MODERN = Path(__file__).parent / "fixtures" / "embed" / "modern-bert.gguf"
RERANK = MODERN.with_name("modern-bert-rerank.gguf")
RECORDED = json.loads(MODERN.with_suffix(".json").read_text())


@pytest.mark.parametrize("pooling", ["mean", "cls"])
def test_vectors_match_llama_servers(pooling):
    worker = load_worker(pooling, path=MODERN)
    assert worker.embedder.encoder.spec.windows == (0, 4, 4, 0, 4, 4)   # every third layer global, from 0
    for ids, vec, want in zip(RECORDED["prompts"], worker.embedder.run(RECORDED["prompts"]),
                              RECORDED["embeddings"][pooling]):
        torch.testing.assert_close(torch.tensor(normalize(vec[0])).double(), torch.tensor(want).double(),
                                   atol=3e-5, rtol=0, msg=str(ids))


def test_the_reranker_head_gives_llama_servers_scores():
    """gte-reranker-modernbert's head: the mean through cls (no bias), GELU, cls.norm, cls.output.
    Within 1e-3 of scores of magnitude ~5 (two of four differ by 4e-4, most likely where the head's
    GELU, read from ggml's f16 table, steps on a 1e-7 difference of the pooled row; the table is
    closer than the exact GELU on every score); the first or the last token instead of the mean is
    off by more than 1 on most scores."""
    recorded = json.loads(RERANK.with_suffix(".json").read_text())
    with embedding_client(rerank=True, path=RERANK) as client:
        r = client.post("/v1/rerank", json={"query": recorded["query"], "documents": recorded["documents"]})
        assert r.status_code == 200, r.text
        got = [x["relevance_score"] for x in sorted(r.json()["results"], key=lambda x: x["index"])]
        assert got == pytest.approx(recorded["scores"], abs=1e-3)
        assert [x["index"] for x in r.json()["results"]] == sorted(range(4), key=lambda i: -recorded["scores"][i])
        assert r.json()["usage"]["prompt_tokens"] == recorded["prompt_tokens"]


def test_the_openai_route_serves_it_and_generation_and_rank_refuse_it():
    with embedding_client(path=MODERN) as client:
        r = client.post("/v1/embeddings", json={"input": RECORDED["prompts"][:2], "model": "x"})
        assert r.status_code == 200, r.text
        want = RECORDED["embeddings"]["mean"][:2]
        torch.testing.assert_close(torch.tensor([d["embedding"] for d in r.json()["data"]]).double(),
                                   torch.tensor(want).double(), atol=3e-5, rtol=0)
    with pytest.raises(GGUFError, match="modern-bert is an embedding model"):
        LlamaModel.load(MODERN)
    with pytest.raises(ConfigError, match="rank pooling"):
        load_worker(rerank=True, path=MODERN)
