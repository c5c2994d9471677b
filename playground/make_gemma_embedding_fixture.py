"""Make tests/fixtures/embed/gemma-embedding.gguf/.json: a tiny random EmbeddingGemma (llama.cpp's
`gemma-embedding`: gemma3's block attending both ways, symmetric windows on 5 of 6 layers, mean
pooling, sentence-transformers' dense_2/dense_3 projections after it) and llama-server's
/embeddings of three token-id prompts (`--embedding`, mean and last pooling; -fa off).

    .venv/bin/python playground/make_gemma_embedding_fixture.py
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import gguf
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "playground"))
from make_arch_fixtures import prompts  # noqa: E402
from make_bert_fixture import record_token_embeddings  # noqa: E402
from tiny_gguf import write_tiny_gguf  # noqa: E402

OUT = ROOT / "tests" / "fixtures" / "embed" / "gemma-embedding.gguf"
U32 = gguf.GGUFValueType.UINT32
D, DENSE = 32, 48


def with_dense(w: dict) -> dict:
    rng = np.random.default_rng(13)
    return w | {"dense_2.weight": (rng.standard_normal((DENSE, D)) / np.sqrt(D)).astype(np.float32),
                "dense_3.weight": (rng.standard_normal((D, DENSE)) / np.sqrt(DENSE)).astype(np.float32)}


def main() -> None:
    OUT.parent.mkdir(parents=True, exist_ok=True)
    a = "gemma-embedding"
    path = write_tiny_gguf(OUT, arch=a, n_layers=6, head_dim=16, features=("qk_norm", "post_norms"), rope_base=1e6,
                           transform=with_dense, seed=14, d_model=D, n_heads=4, n_kv_heads=2, d_ff=64, ctx_len=512,
                           **{f"{a}.attention.sliding_window": (4, U32), f"{a}.pooling_type": (1, U32),
                              f"{a}.dense_2_feat_in": (D, U32), f"{a}.dense_2_feat_out": (DENSE, U32),
                              f"{a}.dense_3_feat_in": (DENSE, U32), f"{a}.dense_3_feat_out": (D, U32),
                              "tokenizer.ggml.pre": "default"})
    out = record_token_embeddings(path, prompts(), ("mean", "last"))
    path.with_suffix(".json").write_text(json.dumps(out) + "\n")
    print(path, path.stat().st_size, [v[:3] for v in out["embeddings"]["mean"]])


if __name__ == "__main__":
    main()
