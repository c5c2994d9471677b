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
RECORDED = json.loads(MODERN.with_suffix(".json").read_text())


@pytest.mark.parametrize("pooling", ["mean", "cls"])
def test_vectors_match_llama_servers(pooling):
    worker = load_worker(pooling, path=MODERN)
    assert worker.embedder.encoder.spec.windows == (0, 4, 4, 0, 4, 4)   # every third layer global, from 0
    for ids, vec, want in zip(RECORDED["prompts"], worker.embedder.run(RECORDED["prompts"]),
                              RECORDED["embeddings"][pooling]):
        torch.testing.assert_close(torch.tensor(normalize(vec[0])).double(), torch.tensor(want).double(),
                                   atol=3e-5, rtol=0, msg=str(ids))


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
