"""slotserver's embeddings and rerank scores against llama-server's, and both servers' throughput.

    .venv/bin/python playground/embeddings_vs_llama.py [--threads 2] [--rounds 20] [--repeat 3] [--decoder]
        [--skip-speed] [--llama-flag=-fa --llama-flag=off] [--slot-flag=--dtype --slot-flag=bfloat16]

Needs a llama.cpp build and the reference models outside the repo (local_server.py: LLAMA_CPP_DIR,
SLOTSERVER_MODELS: minilm/minilm-f16.gguf, all-MiniLM-L6-v2 F16; reranker/tiny-reranker.gguf,
a random 2-layer BERT cross-encoder). Each server runs alone (one at a time, same thread count):
1. `--embedding --pooling mean` and `--pooling cls` on MiniLM: POST /v1/embeddings for the 60 TEXTS
   (sentences, punctuation, accents, CJK, numbers, one of ~230 tokens); per text the cosine similarity
   of the two servers' vectors (min and mean printed), and the usage token counts compared;
2. `--reranking` on the tiny reranker: /rerank of 8 documents for 3 queries, the largest score difference;
3. with --decoder: the default model (SmolLM2-135M Q4_1), pooling last and mean, against llama-server
   with -np 1 (with several sequences in one batch, llama-server's mean over a decoder covers only the
   last tokens of a sequence, e.g. tokens 7-9 of 10: cosine down to 0.65 against the mean of its own
   per-token vectors; with one sequence per batch it is the mean of all);
4. throughput, mean pooling: embeddings/s of one request holding 32 texts, and of 32 concurrent
   single-text requests, `--rounds` times each after a warm-up (llama-server: -np 32, batch 2048 so
   it can put all 32 in one batch; slotserver: its defaults), the two servers alternated `--repeat`
   times (other work on the host slows both alike), the best run of each printed.
"""

from __future__ import annotations

import argparse
import math
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

from local_server import MODELS, PEER, free_port, post, wait_healthy

ROOT = Path(__file__).resolve().parents[1]
BASE = ["The quick brown fox jumps over the lazy dog.", "I believe the meaning of life is",
        "Machine learning is a field of study in artificial intelligence.", "Paris is the capital of France.",
        "Café, naïve, résumé: accents are stripped when lowercasing.", "中文文本 and mixed scripts 日本語",
        "Numbers like 3.14159, 2024 and $1,000,000 tokenize into pieces.", "unaffable antidisestablishmentarianism",
        "Don't stop believing; it's what we'd do!", "hello hello hello", "a", "",
        "Email me at someone@example.com or visit https://example.org/path?q=1",
        "Tabs\tand\nnewlines   and    spaces", "ALL CAPS SENTENCE HERE", "emoji 🙂 are unknown here",
        "The mitochondria is the powerhouse of the cell.", "SELECT * FROM users WHERE id = 42;",
        "def f(x): return x ** 2  # python", "Это предложение на русском языке.",
        "Rain fell softly on the old tin roof all night long.", "Stocks rallied after the announcement.",
        "[CLS] special token text [SEP] inside", "Ünïcödé ßharp ﬁligature"]
LONG = " ".join(BASE[:9]) * 3
TEXTS = BASE + [f"{a} {b}" for a, b in zip(BASE[:18], BASE[6:24])] + [f"Sentence number {i}: {BASE[i % 10]}"
                                                                         for i in range(17)] + [LONG]
LLAMA_FLAGS: list[str] = []   # --llama-flag: more llama-server flags (e.g. -fa off)
SLOT_FLAGS: list[str] = []    # --slot-flag: more slotserver flags (e.g. --dtype bfloat16)
QUERIES = ["Machine learning is", "Which city is the capital?", "a fox"]
DOCS = BASE[:8]


@contextmanager
def server(kind: str, model: Path, threads: int, *flags: str):
    """llama-server ("llama") or slotserver ("slot") on `model`; yields its port once healthy."""
    port = free_port()
    if kind == "llama":
        cmd = [str(PEER / "llama-server"), "-m", str(model), "-t", str(threads), "-np", "32", "-c", "16384",
               "-b", "2048", "-ub", "2048", "--port", str(port), *LLAMA_FLAGS, *flags]
        env = dict(os.environ, LD_LIBRARY_PATH=str(PEER))
    else:
        cmd = [str(ROOT / ".venv/bin/slotserver"), "serve", "-m", str(model), "-t", str(threads),
               "--port", str(port), *SLOT_FLAGS, *flags]
        env = dict(os.environ)
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    try:
        wait_healthy(port, f"{kind} ({' '.join(cmd)})", proc)
        yield port
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def cosine(a: list[float], b: list[float]) -> float:
    dot = sum(x * y for x, y in zip(a, b))
    return dot / math.sqrt(sum(x * x for x in a) * sum(y * y for y in b))


def embeddings(kind: str, threads: int, pooling: str) -> tuple[list[list[float]], int]:
    with server(kind, MODELS / "minilm/minilm-f16.gguf", threads, "--embedding", "--pooling", pooling) as port:
        r = post(port, "/v1/embeddings", {"input": TEXTS})
        return [d["embedding"] for d in sorted(r["data"], key=lambda d: d["index"])], r["usage"]["prompt_tokens"]


def rerank(kind: str, threads: int) -> list[list[float]]:
    with server(kind, MODELS / "reranker/tiny-reranker.gguf", threads, "--reranking") as port:
        out = []
        for q in QUERIES:
            res = post(port, "/rerank", {"query": q, "documents": DOCS})["results"]
            out.append([s for _, s in sorted((x["index"], x["relevance_score"]) for x in res)])
        return out


def decoder(threads: int) -> None:
    from slotserver.model.default_model import default_model_path

    texts = [t for t in TEXTS if t]   # no BOS here: an empty text has no tokens (a 400 on both)
    for pooling in ("last", "mean"):
        got = {}
        for kind in ("slot", "llama"):
            flags = ("--embedding", "--pooling", pooling) + (("-np", "1") if kind == "llama" else ())
            with server(kind, default_model_path(), threads, *flags) as port:
                got[kind] = [d["embedding"] for d in post(port, "/v1/embeddings", {"input": texts})["data"]]
        cos = [cosine(a, b) for a, b in zip(got["slot"], got["llama"])]
        print(f"decoder (SmolLM2 Q4_1) pooling {pooling}: cosine min {min(cos):.5f} mean {sum(cos) / len(cos):.5f} "
              f"over {len(cos)} texts")


def throughput(kind: str, threads: int, rounds: int) -> tuple[float, float]:
    """(embeddings/s with 32 texts in one request, with 32 concurrent one-text requests)."""
    batch = TEXTS[:32]
    with server(kind, MODELS / "minilm/minilm-f16.gguf", threads, "--embedding", "--pooling", "mean") as port:
        post(port, "/v1/embeddings", {"input": batch})   # warm-up
        start = time.perf_counter()
        for _ in range(rounds):
            post(port, "/v1/embeddings", {"input": batch})
        one = 32 * rounds / (time.perf_counter() - start)
        with ThreadPoolExecutor(32) as pool:
            list(pool.map(lambda t: post(port, "/v1/embeddings", {"input": t}), batch))
            start = time.perf_counter()
            for _ in range(rounds):
                list(pool.map(lambda t: post(port, "/v1/embeddings", {"input": t}), batch))
            many = 32 * rounds / (time.perf_counter() - start)
    return one, many


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--repeat", type=int, default=3, help="alternate the two servers this many times")
    ap.add_argument("--skip-speed", action="store_true")
    ap.add_argument("--slot-flag", action="append", default=[], help="a slotserver flag (repeatable), "
                    "e.g. --slot-flag=--dtype --slot-flag=bfloat16")
    ap.add_argument("--decoder", action="store_true", help="also compare a decoder model's pooled states")
    ap.add_argument("--llama-flag", action="append", default=[], help="a llama-server flag (repeatable), "
                    "e.g. --llama-flag=-fa --llama-flag=off: its f32 attention instead of CPU flash attention")
    args = ap.parse_args()
    LLAMA_FLAGS.extend(args.llama_flag)
    SLOT_FLAGS.extend(args.slot_flag)
    print(f"{len(TEXTS)} texts, threads {args.threads}, llama-server flags {LLAMA_FLAGS or 'default'}, "
          f"slotserver flags {SLOT_FLAGS or 'default'}")
    for pooling in ("mean", "cls"):
        (ours, n_ours), (theirs, n_theirs) = (embeddings(k, args.threads, pooling) for k in ("slot", "llama"))
        cos = [cosine(a, b) for a, b in zip(ours, theirs)]
        print(f"pooling {pooling}: cosine min {min(cos):.7f} mean {sum(cos) / len(cos):.7f} over {len(cos)} texts; "
              f"usage tokens {n_ours} vs llama-server {n_theirs}")
    ours, theirs = rerank("slot", args.threads), rerank("llama", args.threads)
    diff = max(abs(a - b) for ra, rb in zip(ours, theirs) for a, b in zip(ra, rb))
    print(f"rerank: {len(QUERIES)} queries x {len(DOCS)} documents, max |score difference| {diff:.2e} "
          f"(scores span {min(min(r) for r in theirs):.4f}..{max(max(r) for r in theirs):.4f})")
    if args.decoder:
        decoder(args.threads)
    if args.skip_speed:
        return
    best: dict[str, tuple[float, float]] = {}
    for _ in range(args.repeat):   # alternated: other load on the host hits both alike
        for kind in ("slot", "llama"):
            one, many = throughput(kind, args.threads, args.rounds)
            old = best.get(kind, (0.0, 0.0))
            best[kind] = (max(old[0], one), max(old[1], many))
            print(f"  {kind}: {one:.0f} / {many:.0f} embeddings/s")
    for kind, (one, many) in best.items():
        name = "slotserver" if kind == "slot" else "llama-server"
        print(f"{name} (best of {args.repeat}): {one:.0f} embeddings/s (32 texts per request), {many:.0f} "
              f"embeddings/s (32 concurrent one-text requests)")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
