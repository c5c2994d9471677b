"""Decode-attention time of every KV layout, side by side, at several batch sizes and contexts.

For each (batch, context) every layout in layouts/ holds the same K/V for `batch` sequences of
`context` tokens (SmolLM2-135M geometry: 3 KV heads, 9 query heads, head_dim 64), and the serving
attention kernel (`attention` for strided views, `paged_attention` for paged ones) decodes one
token per sequence. Layouts are timed interleaved, round after round, so noise hits all alike.
Prints a table (microseconds per layer-call, and the ratio to seq_head_dim) and saves a PNG.

    .venv/bin/python playground/layout_sweep.py [--out playground/out/layout_sweep.png]
    python playground/layout_sweep.py --device cuda --batches 1 8 32 64 --contexts 1024 2048 4096 8192 \
        --dtype bfloat16      # that engineer's experiment, with the serving Triton kernels

On CUDA each layout's call is captured once in a CUDA graph and the graph replayed `reps` times
between two synchronizations: what a step graph would cost, without the launch's Python (eager
times of these small calls measure the host: docs/gpu.md).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from slotserver.runtime.batch import Batch, SeqChunk
from slotserver.runtime.device import kernel_impl, resolve_device
from slotserver.runtime.kernel_set import KernelSet
from slotserver.engine.kv_cache import KVCache
from slotserver.runtime.kv_spec import KVSpec
from slotserver.runtime.layouts import available_layouts

KV_HEADS, Q_HEADS, HEAD_DIM = 3, 9, 64


def fill(cache: KVCache, batch: int, context: int, dtype, device: str) -> None:
    gen = torch.Generator().manual_seed(0)
    for s in range(batch):
        k = torch.randn(context, KV_HEADS, HEAD_DIM, generator=gen).to(device, dtype)
        pos = torch.arange(context, device=device)
        cache.write(0, torch.full((context,), s, device=device), pos, k, k * 0.5)


def time_one(kernels: KernelSet, cache: KVCache, meta, q, reps: int) -> float:
    view = cache.view(0)
    attend = kernels.paged_attention if view.paged else kernels.attention
    attend(q, view, meta, 0.125)
    if q.is_cuda:
        return _graph_time(lambda: attend(q, view, meta, 0.125), reps)
    t = time.perf_counter()
    for _ in range(reps):
        attend(q, view, meta, 0.125)
    return (time.perf_counter() - t) / reps * 1e6


def _graph_time(call, reps: int) -> float:
    """Microseconds per call: the call captured in a CUDA graph, replayed `reps` times."""
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        call()
    graph.replay()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(reps):
        graph.replay()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / reps * 1e6


def sweep(batches, contexts, dtype, rounds: int, reps: int, device: str = "cpu") -> dict:
    kernels, names = KernelSet.load(impl=kernel_impl(device)), available_layouts()
    results = {}
    for b in batches:
        for ctx in contexts:
            spec = KVSpec(1, b, ctx + 1, KV_HEADS, HEAD_DIM, dtype, device=device)
            caches = {n: KVCache.create(n, spec) for n in names}
            for c in caches.values():
                fill(c, b, ctx, dtype, device)
            meta = Batch.build([SeqChunk(s, ctx - 1, [0]) for s in range(b)], device).attn
            q = torch.randn(b, Q_HEADS, HEAD_DIM).to(device, dtype)
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
    ap.add_argument("--device", choices=["auto", "cpu", "cuda"], default="cpu")
    ap.add_argument("--out", type=Path, default=Path("playground/out/layout_sweep.png"))
    ap.add_argument("--replot", type=Path, help="only draw the PNG from a JSON a run saved")
    args = ap.parse_args()
    if args.replot:
        rows = json.loads(args.replot.read_text())["rows"]
        plot({(r.pop("batch"), r.pop("context")): r for r in rows}, args.out)
        return
    device = resolve_device(args.device)
    results = sweep(args.batches, args.contexts, getattr(torch, args.dtype), args.rounds, args.reps, device)
    print(f"device {device}, kernels {kernel_impl(device)}, {args.dtype}")
    print_table(results)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    rows = [{"batch": b, "context": c, **row} for (b, c), row in results.items()]
    args.out.with_suffix(".json").write_text(json.dumps({"device": device, "dtype": args.dtype, "rows": rows}))
    try:
        plot(results, args.out)
    except ImportError as e:   # a GPU image without matplotlib: --replot makes the PNG from the JSON
        print(f"no plot ({e}); the numbers are in {args.out.with_suffix('.json')}")


if __name__ == "__main__":
    main()
