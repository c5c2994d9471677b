"""Make tests/fixtures/bert/: a tiny random BERT GGUF and, where the llama.cpp peer is built, its outputs.

    .venv/bin/python playground/make_bert_fixture.py            # the GGUF, then llama-server's outputs
    .venv/bin/python playground/make_bert_fixture.py --no-peer  # the GGUF only
    .venv/bin/python playground/make_bert_fixture.py --nomic    # tiny-nomic.gguf and .json instead

`tiny-bert.gguf` is what llama.cpp's converter writes for a BERT model (arch `bert`, its metadata
keys and tensor names), small enough to commit (~100 KB): 2 layers, d_model 32, 4 heads, d_ff 64,
64 positions, token types, every bias, layer-norm weights away from 1, the `cls` dense layer and a
2-label `cls.output` classifier, mean pooling in its metadata. Its WordPiece vocabulary (120 pieces,
in llama.cpp's form: `▁` marks a word start, continuations lose `##`) holds every lowercase letter as
a word start and as a continuation, digits, punctuation, two CJK characters, a few whole words and
pieces, and the specials at ids 0-4 (not BERT's usual 100-103, so the metadata's ids must be read).
The token embedding is stored in F16, everything else in F32.

With a llama.cpp build (local_server.py: LLAMA_CPP_DIR), `tiny-bert.json` records llama-server's answers on
it, run with `-fa off` (its f32 attention: with flash attention on, llama.cpp's CPU kernel casts K and V,
and for small batches Q and the running V sums, to f16, which moved these vectors by up to ~2e-4): /tokenize of tricky texts (`tokenize`), /embeddings for pooling mean, cls, last and none
(`embeddings`: raw for none, else normalized), and /rerank scores (`rerank`), for tests/test_embeddings.py.

`--nomic` writes `tiny-nomic.gguf` (arch `nomic-bert`, as the converter writes nomic-embed-text: q|k|v
in one `attn_qkv`, no biases but the norms', a SiLU-gated FFN, no position embeddings, rotary base 1000)
on the same vocabulary, and `tiny-nomic.json` with its /tokenize and /embeddings answers (no classifier:
no /rerank).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import gguf
import numpy as np

from local_server import PEER, free_port, post, wait_healthy

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from tiny_gguf import finish_gguf  # noqa: E402
OUT = ROOT / "tests" / "fixtures" / "bert"
D, HEADS, FF, LAYERS, CTX, LABELS = 32, 4, 64, 2, 64, 2
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
WORDS = ["the", "is", "test", "hello", "world", "this", "machine", "learning", "paris", "cafe", "un", "don",
         "[unused0]", "中", "文"]
PIECES = ["aff", "able", "ing", "ed"]
PUNCT = list(".,!?'-()\":;$")
TEXTS = ["hello world", "Hello, World!", "This is a test.", "Café naïve résumé", "中文 test 中", "unaffable",
         "don't stop", "[CLS] special [SEP] tokens", "[unused0] stays a word", "tabs\tand\nnewlines  here",
         "ÀÉÎ õü", "machine learning is fun", "paris 2024: $5 (cheap)!", "x", "the the the the the the"]
QUERY, DOCS = "machine learning", ["learning machines", "paris is a city", "hello world", "un test"]


def vocab() -> tuple[list[str], list[int]]:
    """(tokens in llama.cpp's GGUF form, token types)."""
    letters = [chr(c) for c in range(ord("a"), ord("z") + 1)]
    digits = [str(d) for d in range(10)]
    starts = WORDS + letters + digits + PUNCT
    tokens = SPECIALS + ["▁" + w for w in starts] + PIECES + letters + digits
    types = [int(gguf.TokenType.CONTROL)] * len(SPECIALS) + [int(gguf.TokenType.NORMAL)] * (len(tokens) - len(SPECIALS))
    assert len(set(tokens)) == len(tokens)
    return tokens, types


def tensors(rng: np.random.Generator, n_vocab: int) -> dict[str, np.ndarray]:
    """Every tensor, in numpy (row-major, llama.cpp's `[out, in]` for matrices)."""
    def normal(*shape: int, scale: float = 1.0) -> np.ndarray:
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    def norm(name: str) -> dict[str, np.ndarray]:
        return {f"{name}.weight": 1 + normal(D, scale=0.2), f"{name}.bias": normal(D, scale=0.1)}

    t = {"token_embd.weight": normal(n_vocab, D), "position_embd.weight": normal(CTX, D, scale=0.5),
         "token_types.weight": normal(2, D, scale=0.5), **norm("token_embd_norm")}
    for i in range(LAYERS):
        p = f"blk.{i}."
        for n in ("attn_q", "attn_k", "attn_v", "attn_output"):
            t[p + n + ".weight"], t[p + n + ".bias"] = normal(D, D, scale=D ** -0.5), normal(D, scale=0.1)
        t |= {p + "ffn_up.weight": normal(FF, D, scale=D ** -0.5), p + "ffn_up.bias": normal(FF, scale=0.1),
              p + "ffn_down.weight": normal(D, FF, scale=FF ** -0.5), p + "ffn_down.bias": normal(D, scale=0.1)}
        t |= norm(p + "attn_output_norm") | norm(p + "layer_output_norm")
    t |= {"cls.weight": normal(D, D, scale=D ** -0.5), "cls.bias": normal(D, scale=0.1),
          "cls.output.weight": normal(LABELS, D, scale=D ** -0.5), "cls.output.bias": normal(LABELS, scale=0.1)}
    return t


def nomic_tensors(rng: np.random.Generator, n_vocab: int) -> dict[str, np.ndarray]:
    """nomic-bert's tensors: fused q|k|v, gated FFN, norms with biases, nothing else biased."""
    def normal(*shape: int, scale: float = 1.0) -> np.ndarray:
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    def norm(name: str) -> dict[str, np.ndarray]:
        return {f"{name}.weight": 1 + normal(D, scale=0.2), f"{name}.bias": normal(D, scale=0.1)}

    t = {"token_embd.weight": normal(n_vocab, D), "token_types.weight": normal(2, D, scale=0.5), **norm("token_embd_norm")}
    for i in range(LAYERS):
        p = f"blk.{i}."
        t |= {p + "attn_qkv.weight": normal(3 * D, D, scale=D ** -0.5), p + "attn_output.weight": normal(D, D, scale=D ** -0.5),
              p + "ffn_gate.weight": normal(FF, D, scale=D ** -0.5), p + "ffn_up.weight": normal(FF, D, scale=D ** -0.5),
              p + "ffn_down.weight": normal(D, FF, scale=FF ** -0.5)}
        t |= norm(p + "attn_output_norm") | norm(p + "layer_output_norm")
    return t


def encoder_writer(path: Path, arch: str, name: str, eps: float, pooling: gguf.PoolingType) -> gguf.GGUFWriter:
    """A GGUF writer with the tiny encoder's sizes (D, FF, LAYERS, HEADS, CTX), bidirectional."""
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name(name)
    w.add_context_length(CTX)
    w.add_embedding_length(D)
    w.add_feed_forward_length(FF)
    w.add_block_count(LAYERS)
    w.add_head_count(HEADS)
    w.add_layer_norm_eps(eps)
    w.add_causal_attention(False)
    w.add_pooling_type(pooling)
    return w


def write(path: Path, seed: int = 35, arch: str = "bert") -> Path:
    tokens, types = vocab()
    w = encoder_writer(path, arch, "tiny-bert", 1e-12, gguf.PoolingType.MEAN)
    if arch == "nomic-bert":
        w.add_rope_freq_base(1000.0)
    else:
        w.add_classifier_output_labels(["yes", "no"])
    w.add_token_type_count(2)
    w.add_tokenizer_model("bert")
    w.add_token_list(tokens)
    w.add_token_types(types)
    for key, tid in (("bos", 2), ("eos", 3), ("unk", 1), ("sep", 3), ("pad", 0), ("mask", 4)):
        getattr(w, f"add_{key}_token_id")(tid)
    w.add_add_bos_token(True)
    w.add_add_eos_token(True)
    w.add_add_sep_token(False)
    w.add_bool("tokenizer.ggml.normalizer.lowercase", True)
    make = nomic_tensors if arch == "nomic-bert" else tensors
    t = make(np.random.default_rng(seed), len(tokens))
    return finish_gguf(w, {n: v.astype(np.float16) if n == "token_embd.weight" else v for n, v in t.items()}, path)


def record_token_embeddings(path: Path, prompts: list[list[int]], poolings: tuple[str, ...]) -> dict:
    """llama-server's /embeddings of each token-id prompt, per pooling (normalized vectors)."""
    out: dict = {"prompts": prompts, "embeddings": {}}
    for pooling in poolings:
        with llama_server(path, "--embedding", "--pooling", pooling) as port:
            out["embeddings"][pooling] = [post(port, "/embeddings", {"content": ids}, timeout_s=120)[0]["embedding"][0]
                                          for ids in prompts]
    return out


def llama_server(path: Path, *flags: str):
    """A started llama-server on `path` with `flags` (a context manager yielding its port)."""
    from contextlib import contextmanager

    @contextmanager
    def run():
        port = free_port()
        cmd = [str(PEER / "llama-server"), "-m", str(path), "--port", str(port), "-c", "256", "-np", "1",
               "-t", "2", "--no-warmup", "-fa", "off", *flags]
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                env=dict(os.environ, LD_LIBRARY_PATH=str(PEER)))
        try:
            wait_healthy(port, "llama-server", proc, timeout_s=60)
            yield port
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    return run()


def record(path: Path, rerank: bool = True) -> dict:
    out: dict = {"texts": TEXTS, "query": QUERY, "documents": DOCS, "embeddings": {}}
    for pooling in ("mean", "cls", "last", "none"):
        with llama_server(path, "--embedding", "--pooling", pooling) as port:
            if pooling == "mean":
                out["tokenize"] = [post(port, "/tokenize", {"content": t, "add_special": True},
                                        timeout_s=120)["tokens"] for t in TEXTS]
            rows = post(port, "/embeddings", {"content": TEXTS}, timeout_s=120)
            out["embeddings"][pooling] = [r["embedding"] for r in sorted(rows, key=lambda r: r["index"])]
    if not rerank:
        return out
    with llama_server(path, "--reranking") as port:
        res = post(port, "/rerank", {"query": QUERY, "documents": DOCS}, timeout_s=120)
        out["rerank"] = {"scores": [r["relevance_score"] for r in sorted(res["results"], key=lambda r: r["index"])],
                         "prompt_tokens": res["usage"]["prompt_tokens"]}
    return out


def _rounded(obj):
    if isinstance(obj, float):
        return float(f"{obj:.8g}")
    if isinstance(obj, dict):
        return {k: _rounded(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_rounded(v) for v in obj]
    return obj


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--no-peer", action="store_true", help="write the GGUF only")
    ap.add_argument("--nomic", action="store_true", help="the nomic-bert fixture (tiny-nomic.*)")
    args = ap.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    path = write(OUT / "tiny-nomic.gguf", 36, "nomic-bert") if args.nomic else write(OUT / "tiny-bert.gguf")
    print(f"{path}: {path.stat().st_size} bytes")
    if not args.no_peer:
        text = json.dumps(_rounded(record(path, rerank=not args.nomic)))   # 8 significant digits: float32's
        path.with_suffix(".json").write_text(text + "\n")
        print(f"{path.with_suffix('.json')} written")


if __name__ == "__main__":
    main()
