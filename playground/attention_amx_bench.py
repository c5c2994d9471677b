"""Prompt-row attention on one thread: cycles per (query vector, cell), AMX tiles vs the row kernel.

The agent loop's shape by default (SmolLM2-135M: 9 query / 3 KV heads of 64, f16 cache): a chunk of
`--rows` new prompt rows at the end of a `--history`-cell stream, so each row sees history + its
position cells. Both paths are timed through kernels/attention.py's `cpu` (the serving entry);
`prompt=True` chunks take the AMX tiles where the CPU has them, `prompt=False` the row kernel.
Cycles are nanoseconds times the TSC's clock (/proc/cpuinfo's "cpu MHz", constant_tsc); the error
is the largest absolute difference from kernels/attention.py's float32 reference on a few rows.

    nice .venv/bin/python playground/attention_amx_bench.py [--rows 600] [--history 4500] [--chunks 1]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from slotserver.runtime.batch import Batch, SeqChunk
from slotserver.runtime.kernel_set import KERNEL_CONTRACT
from slotserver.runtime.kv_spec import StridedKV
from slotserver.runtime.loader import load_by_path


def tsc_ghz() -> float:
    """The TSC's rate: the first "cpu MHz" of /proc/cpuinfo (a constant TSC reports its nominal)."""
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("cpu MHz"):
            return float(line.split(":")[1]) / 1000
    return 1.0


def case(rows: int, history: int, streams: int, hq: int, hkv: int, dim: int, prompt: bool):
    """`streams` sequences, each a chunk of `rows` prompt rows after `history` cached cells."""
    gen = torch.Generator().manual_seed(0)
    cells = history + rows
    k = torch.randn(streams, cells, hkv, dim, generator=gen).half()
    v = torch.randn(streams, cells, hkv, dim, generator=gen).half()
    chunks = [SeqChunk(stream=s, start=history, tokens=[0] * rows, prompt=prompt) for s in range(streams)]
    meta = Batch.build(chunks).attn
    q = torch.randn(rows * streams, hq, dim, generator=gen)
    return q, StridedKV(k, v), meta, dim ** -0.5


def seconds(fn, repeat: int, clock=time.perf_counter) -> float:
    """Best of `repeat` calls after a warm-up. With one thread the clock is the thread's CPU time
    (time.thread_time: the C runs in the calling thread), which a busy host's other processes do
    not inflate by taking the core away."""
    fn()
    best = float("inf")
    for _ in range(repeat):
        t0 = clock()
        fn()
        best = min(best, clock() - t0)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=600)
    ap.add_argument("--history", type=int, default=4500)
    ap.add_argument("--streams", type=int, default=1)
    ap.add_argument("--heads", default="9,3,64", help="query heads, KV heads, head_dim")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    hq, hkv, dim = (int(x) for x in args.heads.split(","))
    torch.set_num_threads(args.threads)
    mod = load_by_path(Path(__file__).parents[1] / "kernels" / "attention.py", KERNEL_CONTRACT).module
    print(f"attention: {mod.cpu_path()}; rows {args.rows} after {args.history} cells, {args.streams} stream(s), "
          f"{hq}/{hkv} heads of {dim}, f16 cache, {args.threads} thread(s)")
    pairs = hq * args.streams * sum(args.history + r + 1 for r in range(args.rows))   # (query vector, cell)
    ghz = tsc_ghz()
    for name, prompt in (("AMX tiles (prompt rows)", True), ("row kernel", False)):
        q, kv, meta, scale = case(args.rows, args.history, args.streams, hq, hkv, dim, prompt)
        t = seconds(lambda: mod.cpu(q, kv, meta, scale), args.repeat,
                    time.thread_time if args.threads == 1 else time.perf_counter)
        out = mod.cpu(q, kv, meta, scale)
        sub = list(range(0, args.rows, max(1, args.rows // 4))) + [args.rows - 1]
        err = max((out[r] - mod.reference(q[r: r + 1], kv, Batch.build(
            [SeqChunk(stream=0, start=args.history + r, tokens=[0])]).attn, scale)[0]).abs().max().item() for r in sub)
        print(f"{name:26s} {t * 1e3:9.2f} ms  {t * ghz * 1e9 / pairs:6.2f} cycles per (vector, cell)"
              f"  (TSC {ghz:.2f} GHz)  max |err| {err:.2e}")


if __name__ == "__main__":
    main()
