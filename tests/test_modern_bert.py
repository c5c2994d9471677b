"""ModernBERT (`modern-bert`: pre-norm layers, NEOX rotary q/k with a global and a windowed base,
symmetric windows on two of three layers, GEGLU) against llama-server's recorded /embeddings on a
tiny random model of it (tests/fixtures/embed/modern-bert.gguf/.json, playground/make_modern_bert_fixture.py)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from embed_server import embedding_client, load_worker
from slotserver.errors import ConfigError, GGUFError
from slotserver.model.encoder.embedder import _rank_rows
from slotserver.model.encoder.pooling import normalize
from slotserver.model.model import LlamaModel
from slotserver.server.routes.rerank import rerank_tokens

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
    off by more than 1."""
    recorded = json.loads(RERANK.with_suffix(".json").read_text())
    with embedding_client(rerank=True, path=RERANK) as client:
        r = client.post("/v1/rerank", json={"query": recorded["query"], "documents": recorded["documents"]})
        assert r.status_code == 200, r.text
        got = [x["relevance_score"] for x in sorted(r.json()["results"], key=lambda x: x["index"])]
        assert got == pytest.approx(recorded["scores"], abs=1e-3)
        assert [x["index"] for x in r.json()["results"]] == sorted(range(4), key=lambda i: -recorded["scores"][i])
        assert r.json()["usage"]["prompt_tokens"] == recorded["prompt_tokens"]
    worker = load_worker(rerank=True, path=RERANK)   # the head on the first or the last token instead
    seqs = [rerank_tokens(worker.embedder.tokenizer, recorded["query"], d, None) for d in recorded["documents"]]
    for rows in ("first", "last"):
        worker.embedder.rank = replace(worker.embedder.rank, rows=rows)
        wrong = [float(v[0][0]) for v in worker.embedder.run(seqs)]
        assert max(abs(a - b) for a, b in zip(wrong, recorded["scores"])) > 1, rows


@pytest.mark.parametrize("key, default, rows", [(None, "first", "first"), (1, "first", "mean"), (2, "last", "last"),
                                                (None, "mean_default", "mean")])
def test_rank_pooling_reads_the_mean_where_the_classifier_pooling_type_says_so(key, default, rows):
    """llama.cpp checks `{arch}.classifier.pooling_type` == mean before the architecture's own rows
    (BERT's first token, a causal decoder's last); ModernBERT defaults to the mean."""
    md = {"general.architecture": "bert"} | ({} if key is None else {"bert.classifier.pooling_type": key})
    f = SimpleNamespace(metadata=md)
    got = _rank_rows(f, "first", mean_default=True) if default == "mean_default" else _rank_rows(f, default)
    assert got == rows


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
