"""Decode-attention time of every KV layout, side by side, at several batch sizes and contexts.

For each (batch, context) every layout in layouts/ holds the same K/V for `batch` sequences of
`context` tokens (SmolLM2-135M geometry: 3 KV heads, 9 query heads, head_dim 64), and the serving
attention kernel (`attention` for strided views, `paged_attention` for paged ones) decodes one
token per sequence. Layouts are timed interleaved, round after round, so noise hits all alike.
Prints a table (microseconds per layer-call, and the ratio to seq_head_dim) and saves a PNG.

    .venv/bin/python playground/layout_sweep.py [--out playground/out/layout_sweep.png]
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch

from slotserver.runtime.batch import Batch, SeqChunk
from slotserver.runtime.kernel_set import KernelSet
from slotserver.engine.kv_cache import KVCache
from slotserver.runtime.kv_spec import KVSpec
from slotserver.runtime.layouts import available_layouts

KV_HEADS, Q_HEADS, HEAD_DIM = 3, 9, 64


def fill(cache: KVCache, batch: int, context: int, dtype) -> None:
    gen = torch.Generator().manual_seed(0)
    for s in range(batch):
        k = torch.randn(context, KV_HEADS, HEAD_DIM, generator=gen).to(dtype)
        cache.write(0, torch.full((context,), s), torch.arange(context), k, k * 0.5)


def time_one(kernels: KernelSet, cache: KVCache, meta, q, reps: int) -> float:
    view = cache.view(0)
    attend = kernels.paged_attention if view.paged else kernels.attention
    attend(q, view, meta, 0.125)
    t = time.perf_counter()
    for _ in range(reps):
        attend(q, view, meta, 0.125)
    return (time.perf_counter() - t) / reps * 1e6


def sweep(batches, contexts, dtype, rounds: int, reps: int) -> dict:
    kernels, names = KernelSet.load(), available_layouts()
    results = {}
    for b in batches:
        for ctx in contexts:
            spec = KVSpec(1, b, ctx + 1, KV_HEADS, HEAD_DIM, dtype)
            caches = {n: KVCache.create(n, spec) for n in names}
            for c in caches.values():
                fill(c, b, ctx, dtype)
            meta = Batch.build([SeqChunk(s, ctx - 1, [0]) for s in range(b)]).attn
            q = torch.randn(b, Q_HEADS, HEAD_DIM).to(dtype)
            times = {n: [] for n in names}
            for _ in range(rounds):
                for n in names:
                    times[n].append(time_one(kernels, caches[n], meta, q, reps))
            results[(b, ctx)] = {n: statistics.median(t) for n, t in times.items()}
    return results


def print_table(results: dict) -> None:
    names = list(next(iter(results.values())))
    print(f"decode attention, microseconds per call (one layer); (x) = time / seq_head_dim; torch threads {torch.get_num_threads()}")
    print(f"{'batch':>6}{'context':>9}" + "".join(f"{n:>20}" for n in names))
    for (b, ctx), row in results.items():
        base = row.get("seq_head_dim", 1.0)
        print(f"{b:6}{ctx:9}" + "".join(f"{row[n]:12.0f} ({row[n] / base:4.2f})" for n in names))


def plot(results: dict, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(next(iter(results.values())))
    batches = sorted({b for b, _ in results})
    fig, axes = plt.subplots(1, len(batches), figsize=(4 * len(batches), 3.5), squeeze=False)
    for ax, b in zip(axes[0], batches):
        ctxs = sorted(c for bb, c in results if bb == b)
        for n in names:
            ax.plot(ctxs, [results[(b, c)][n] for c in ctxs], marker="o", label=n)
        ax.set(title=f"batch {b}", xlabel="context (tokens)", ylabel="µs per layer", xscale="log", yscale="log")
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    print(f"plot saved to {out}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--contexts", type=int, nargs="+", default=[128, 512, 2048])
    ap.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--out", type=Path, default=Path("playground/out/layout_sweep.png"))
    args = ap.parse_args()
    results = sweep(args.batches, args.contexts, getattr(torch, args.dtype), args.rounds, args.reps)
    print_table(results)
    plot(results, args.out)


if __name__ == "__main__":
    main()
