"""Make tests/fixtures/rerank/qwen3-reranker.gguf/.json: a tiny random qwen3 model shaped as llama.cpp's
converter writes Qwen3-Reranker (conversion/qwen.py): pooling type rank, labels ["yes", "no"], the
`cls.output` head (here random rows, in the real model the output projection's "yes" and "no"
rows), and a `tokenizer.chat_template.rerank` with `{query}` and `{document}`; and llama-server's
/rerank scores on it (`--reranking`, an f32 KV cache: the last token's result_norm through cls.output, softmax).

    .venv/bin/python playground/make_decoder_reranker_fixture.py
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
from local_server import post  # noqa: E402
from make_bert_fixture import llama_server  # noqa: E402
from tiny_gguf import write_tiny_gguf  # noqa: E402

OUT = ROOT / "tests" / "fixtures" / "rerank" / "qwen3-reranker.gguf"
TEMPLATE = ("<|im_start|>system\nJudge whether the Document meets the Query.<|im_end|>\n"
            "<|im_start|>user\n<Query>: {query}\n<Document>: {document}<|im_end|>\n<|im_start|>assistant\n")
QUERY, DOCS = "machine learning", ["learning machines", "paris is a city", "hello world", "a b c d e f"]


def with_head(w: dict) -> dict:
    rng = np.random.default_rng(11)
    d = w["output_norm.weight"].shape[0]
    return w | {"cls.output.weight": (rng.standard_normal((2, d)) * 2).astype(np.float32)}


def main() -> None:
    OUT.parent.mkdir(parents=True, exist_ok=True)
    path = write_tiny_gguf(OUT, arch="qwen3", head_dim=16, features=("qk_norm",), transform=with_head, seed=12,
                           d_model=32, n_heads=4, n_kv_heads=2, d_ff=64, ctx_len=512,
                           **{"qwen3.pooling_type": (int(gguf.PoolingType.RANK), gguf.GGUFValueType.UINT32),
                              "qwen3.classifier.output_labels": (["yes", "no"], gguf.GGUFValueType.ARRAY),
                              "tokenizer.chat_template.rerank": TEMPLATE, "tokenizer.ggml.pre": "default"})
    with llama_server(path, "--reranking", "-ctk", "f32", "-ctv", "f32") as port:   # f32 KV: the reference
        res = post(port, "/rerank", {"query": QUERY, "documents": DOCS}, timeout_s=120)
    out = {"query": QUERY, "documents": DOCS,
           "scores": [r["relevance_score"] for r in sorted(res["results"], key=lambda r: r["index"])],
           "prompt_tokens": res["usage"]["prompt_tokens"]}
    path.with_suffix(".json").write_text(json.dumps(out) + "\n")
    print(path, path.stat().st_size, out["scores"])


if __name__ == "__main__":
    main()
