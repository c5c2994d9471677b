"""Short alternating bursts, slotserver's model against llama.cpp's benchmarks, on a busy host.

On a 2-core host that other work keeps at a load of 5-10, a whole model_vs_llama.py round (one
llama-batched-bench at 32 sequences prefills 4096 tokens) almost never runs in a quiet spell, and
its per-round ratios spread over 100x. Here each measurement is short and they alternate, llama.cpp
then slotserver, N times; each side's best burst (and its upper quartile) approximates what a quiet
host gives, and a neighbour's burst hits both sides alike over the N alternations.

- pp128: llama-bench -p 128 -n 0 -r 1 / one 128-token prefill of the model;
- tg b=1: llama-bench -p 0 -n 16 -r 1 / 16 decode steps at batch 1 (128 deep);
- tg b=8, b=32: llama-batched-bench -npp 128 -ntg 16 -npl 8 (32) / 16 steps at batch 8 (32), 128 deep.

    .venv/bin/python playground/moe_bursts.py --llama-bin DIR --model F.gguf [-n 12] [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import time
from pathlib import Path

import torch

import cpu_formats
from slotserver.runtime.batch import Batch, SeqChunk


def llama(bin_dir: Path, model: str, threads: int, what: str) -> float:
    env = dict(os.environ, LD_LIBRARY_PATH=str(bin_dir))
    if what in ("tg b=8", "tg b=32"):
        npl = what.split("=")[1]
        out = subprocess.run([str(bin_dir / "llama-batched-bench"), "-m", model, "-c", "8192", "-npp", "128", "-ntg", "16",
                              "-npl", npl, "-t", str(threads), "--output-format", "jsonl"], capture_output=True,
                             text=True, check=True, env=env).stdout
        return next(json.loads(ln)["speed_tg"] for ln in out.splitlines() if ln.startswith("{"))
    p, n = ("128", "0") if what == "pp128" else ("0", "16")
    out = subprocess.run([str(bin_dir / "llama-bench"), "-m", model, "-p", p, "-n", n, "-r", "1", "-t", str(threads),
                          "-o", "jsonl"], capture_output=True, text=True, check=True, env=env).stdout
    return next(json.loads(ln)["avg_ts"] for ln in out.splitlines() if ln.startswith("{"))


def ours(model, cache, toks, what: str, step: int) -> float:
    logits = torch.empty(32, model.weights.output.out_features)
    if what == "pp128":
        t = time.perf_counter()
        model.forward(Batch.build([SeqChunk(31, 0, toks)]), cache, logits)
        return len(toks) / (time.perf_counter() - t)
    b = int(what.split("=")[1])
    t = time.perf_counter()
    for i in range(16):
        model.forward(Batch.build([SeqChunk(s, cpu_formats.DEPTH + (step * 16 + i) % 48, [500]) for s in range(b)]),
                      cache, logits)
    return 16 * b / (time.perf_counter() - t)


def main() -> None:
    args = parse_args(12)
    torch.set_num_threads(args.threads)
    cpu_formats.MODEL = args.model
    model, cache, toks = cpu_formats.setup("auto:auto")
    run_bursts(args, lambda w, i: ours(model, cache, toks, w, i))


def parse_args(default_n: int) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--llama-bin", required=True, type=Path)
    ap.add_argument("--model", required=True)
    ap.add_argument("-n", type=int, default=default_n)
    ap.add_argument("--threads", type=int, default=2)
    return ap.parse_args()


WHAT = ("pp128", "tg b=1", "tg b=8", "tg b=32")


def run_bursts(args: argparse.Namespace, measure) -> None:
    """args.n rounds of each of WHAT, llama.cpp then `measure(what, round)`; each burst printed, then
    each side's best / upper quartile / median and their ratios."""
    got = {(side, w): [] for side in ("llama.cpp", "slotserver") for w in WHAT}
    for i in range(args.n):
        for w in WHAT:
            got[("llama.cpp", w)].append(llama(args.llama_bin, args.model, args.threads, w))
            got[("slotserver", w)].append(measure(w, i))
        print(f"burst {i + 1} (load {os.getloadavg()[0]:.1f}): " + "  ".join(
            f"{w} {got[('llama.cpp', w)][-1]:.1f} / {got[('slotserver', w)][-1]:.1f}" for w in WHAT), flush=True)
    print(f"model {Path(args.model).name}, {args.threads} threads, tokens/s over {args.n} alternating bursts "
          f"(llama.cpp / slotserver, ratio)")
    for w in WHAT:
        a, b = got[("llama.cpp", w)], got[("slotserver", w)]
        q = lambda v: statistics.quantiles(v, n=4)[2] if len(v) > 1 else v[0]   # noqa: E731
        print(f"{w:8} best {max(a):8.1f} / {max(b):8.1f} ({max(b) / max(a):4.2f})   upper quartile {q(a):8.1f} / "
              f"{q(b):8.1f} ({q(b) / q(a):4.2f})   median {statistics.median(a):8.1f} / {statistics.median(b):8.1f}")


if __name__ == "__main__":
    main()
