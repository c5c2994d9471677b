"""EmbeddingGemma (`gemma-embedding`: gemma3's block attending both ways, symmetric windows, dense
projections after pooling) against llama-server's recorded /embeddings on a tiny random model of
it (tests/fixtures/embed/gemma-embedding.gguf/.json, playground/make_gemma_embedding_fixture.py);
and such a file refused for generation."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from embed_server import embedding_client, load_worker
from slotserver.errors import GGUFError
from slotserver.model.bundle import ModelBundle
from slotserver.model.config import ModelConfig
from slotserver.model.encoder.pooling import normalize

GEMMA_EMBED = Path(__file__).parent / "fixtures" / "embed" / "gemma-embedding.gguf"
RECORDED = json.loads(GEMMA_EMBED.with_suffix(".json").read_text())
TOL = 2.5e-4   # llama.cpp's GEGLU through ggml's f16 GELU table: one element near a rounding boundary


@pytest.mark.parametrize("pooling", ["mean", "last"])
def test_vectors_match_llama_servers(pooling):
    worker = load_worker(pooling, path=GEMMA_EMBED)
    got = worker.embedder.run(RECORDED["prompts"])
    for ids, vec, want in zip(RECORDED["prompts"], got, RECORDED["embeddings"][pooling]):
        assert vec.shape == (1, 32), ids
        torch.testing.assert_close(torch.tensor(normalize(vec[0])).double(), torch.tensor(want).double(),
                                   atol=TOL, rtol=0, msg=str(ids))


def test_a_later_token_changes_an_earlier_tokens_vector():
    """Attention both ways: appending a token changes the first token's state (a causal model's
    would not)."""
    worker = load_worker("none", path=GEMMA_EMBED)
    base = [5, 17, 200]
    alone, longer = worker.embedder.run([base, base + [33]])
    assert (alone[0] - longer[0]).abs().max() > 1e-3


def test_the_openai_route_serves_it_and_generation_refuses_it():
    with embedding_client(path=GEMMA_EMBED) as client:
        r = client.post("/v1/embeddings", json={"input": RECORDED["prompts"][:2], "model": "x"})
        assert r.status_code == 200, r.text
        got = [d["embedding"] for d in r.json()["data"]]
        want = RECORDED["embeddings"]["mean"][:2]
        torch.testing.assert_close(torch.tensor(got).double(), torch.tensor(want).double(), atol=TOL, rtol=0)
    with pytest.raises(GGUFError, match="gemma-embedding is an embedding model"):
        ModelBundle.load(ModelConfig(GEMMA_EMBED))
