"""nomic-bert (nomic-embed-text's architecture) against llama-server's recorded answers on a tiny
random model of it (tests/fixtures/bert/tiny-nomic.gguf/.json, playground/make_bert_fixture.py --nomic):
rotary q/k instead of position embeddings, a SiLU-gated FFN, fused q|k|v; and what a client of
/v1/embeddings gets from a server of it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from embed_server import embedding_client, load_worker
from slotserver.errors import GGUFError
from slotserver.model.encoder.pooling import normalize
from slotserver.model.model import LlamaModel

TINY_NOMIC = Path(__file__).parent / "fixtures" / "bert" / "tiny-nomic.gguf"
RECORDED = json.loads(TINY_NOMIC.with_suffix(".json").read_text())
TEXTS = RECORDED["texts"]


@pytest.mark.parametrize("pooling", ["mean", "cls", "last", "none"])
def test_vectors_match_llama_servers(pooling):
    worker = load_worker(pooling, path=TINY_NOMIC)
    seqs = [worker.embedder.tokenizer.encode(t, True, True) for t in TEXTS]
    assert seqs == RECORDED["tokenize"]
    for text, vec, want in zip(TEXTS, worker.embedder.run(seqs), RECORDED["embeddings"][pooling]):
        ours = vec.double() if pooling == "none" else torch.tensor([normalize(vec[0])]).double()
        assert ours.shape == (len(want), 32), text
        torch.testing.assert_close(ours, torch.tensor(want).double(), atol=2e-5, rtol=0)


def test_the_rotary_positions_matter():
    """The same tokens in another order give another mean: without the rotary positions (a bag of
    words) they would not."""
    worker = load_worker("mean", path=TINY_NOMIC)
    seq = worker.embedder.tokenizer.encode("hello world this is a test", True, True)
    a, b = worker.embedder.run([seq, [seq[0], *reversed(seq[1:-1]), seq[-1]]])
    assert (a - b).abs().max() > 1e-3


def test_the_openai_route_serves_it_and_generation_refuses_it():
    with embedding_client(path=TINY_NOMIC) as client:
        r = client.post("/v1/embeddings", json={"input": TEXTS[:3], "model": "x"})
        assert r.status_code == 200, r.text
        got = [d["embedding"] for d in r.json()["data"]]
        want = [e[0] for e in RECORDED["embeddings"]["mean"][:3]]
        torch.testing.assert_close(torch.tensor(got).double(), torch.tensor(want).double(), atol=2e-5, rtol=0)
        assert client.post("/rerank", json={"query": "a", "documents": ["b"]}).status_code in (400, 501)
    with pytest.raises(GGUFError, match="nomic-bert is an embedding model"):
        LlamaModel.load(TINY_NOMIC)
