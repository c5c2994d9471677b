"""Make tests/fixtures/embed/modern-bert.gguf/.json: a tiny random ModernBERT as llama.cpp's converter
writes one (arch `modern-bert`: fused q|k|v, gate|up in ffn_up, LayerNorms without biases, layer 0
without its attention norm, global rope base 160000 and windowed 10000, symmetric windows of 4 on
layers 1, 2, 4 and 5) and llama-server's /embeddings of three token-id prompts (mean, cls, -fa off).

    .venv/bin/python playground/make_modern_bert_fixture.py

`modern-bert-rerank.gguf/.json`: the same model with gte-reranker-modernbert's head (cls without a
bias, GELU, cls.norm, a one-label cls.output, on the mean) and llama-server's /rerank scores.
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
from local_server import post  # noqa: E402
from make_bert_fixture import finish, llama_server, record_token_embeddings  # noqa: E402
from tiny_gguf import BOS_TOKEN, EOS_TOKEN, tiny_vocab  # noqa: E402

OUT = ROOT / "tests" / "fixtures" / "embed" / "modern-bert.gguf"
RERANK = OUT.with_name("modern-bert-rerank.gguf")
QUERY, DOCS = "machine learning", ["learning machines", "paris is a city", "hello world", "a b c"]
D, FF, HEADS, LAYERS, CTX = 32, 48, 4, 6, 256


def tensors(rng: np.random.Generator, n_vocab: int) -> dict[str, np.ndarray]:
    def normal(*shape: int, scale: float = 1.0) -> np.ndarray:
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    t = {"token_embd.weight": normal(n_vocab, D), "token_embd_norm.weight": 1 + normal(D, scale=0.2),
         "output_norm.weight": 1 + normal(D, scale=0.2)}
    for i in range(LAYERS):
        p = f"blk.{i}."
        if i:
            t[p + "attn_norm.weight"] = 1 + normal(D, scale=0.2)
        t |= {p + "attn_qkv.weight": normal(3 * D, D, scale=D ** -0.5),
              p + "attn_output.weight": normal(D, D, scale=D ** -0.5), p + "ffn_norm.weight": 1 + normal(D, scale=0.2),
              p + "ffn_up.weight": normal(2 * FF, D, scale=D ** -0.5),
              p + "ffn_down.weight": normal(D, FF, scale=FF ** -0.5)}
    return t


def head(rng: np.random.Generator) -> dict[str, np.ndarray]:
    return {"cls.weight": (rng.standard_normal((D, D)) / np.sqrt(D)).astype(np.float32),
            "cls.norm.weight": (1 + 0.2 * rng.standard_normal(D)).astype(np.float32),
            "cls.output.weight": rng.standard_normal((1, D)).astype(np.float32),
            "cls.output.bias": rng.standard_normal(1).astype(np.float32)}


def write(path: Path, rerank: bool = False) -> Path:
    tokens, merges, types = tiny_vocab()
    w = gguf.GGUFWriter(str(path), "modern-bert")
    w.add_name("tiny-modern-bert")
    for add, value in ((w.add_context_length, CTX), (w.add_embedding_length, D), (w.add_feed_forward_length, FF),
                       (w.add_block_count, LAYERS), (w.add_head_count, HEADS), (w.add_layer_norm_eps, 1e-5),
                       (w.add_rope_freq_base, 160000.0), (w.add_sliding_window, 4)):
        add(value)
    w.add_float32("modern-bert.rope.freq_base_swa", 10000.0)
    w.add_causal_attention(False)
    w.add_pooling_type(gguf.PoolingType.MEAN)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("modern-bert")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(tokens.index(BOS_TOKEN))
    w.add_eos_token_id(tokens.index(EOS_TOKEN))
    t = tensors(np.random.default_rng(15), len(tokens))
    if rerank:
        w.add_classifier_output_labels(["score"])
        w.add_add_bos_token(True)
        w.add_add_eos_token(True)
        t |= head(np.random.default_rng(16))
    return finish(w, t, path)


def main() -> None:
    OUT.parent.mkdir(parents=True, exist_ok=True)
    path = write(OUT)
    out = record_token_embeddings(path, prompts(), ("mean", "cls"))
    path.with_suffix(".json").write_text(json.dumps(out) + "\n")
    print(path, path.stat().st_size, [v[:3] for v in out["embeddings"]["mean"]])
    path = write(RERANK, rerank=True)
    with llama_server(path, "--reranking") as port:
        res = post(port, "/rerank", {"query": QUERY, "documents": DOCS}, timeout_s=120)
    scores = [r["relevance_score"] for r in sorted(res["results"], key=lambda r: r["index"])]
    path.with_suffix(".json").write_text(json.dumps({"query": QUERY, "documents": DOCS, "scores": scores,
                                                     "prompt_tokens": res["usage"]["prompt_tokens"]}) + "\n")
    print(path, scores)


if __name__ == "__main__":
    main()
