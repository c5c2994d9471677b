"""kernels/qmatmul.py on CPU: the integer-dot path vs the dequantize-a-tile + torch GEMM path, per
format, rows M and weight shape, for the CPU variant in use (SLOTSERVER_CPU). Prints GFLOP/s and
the effective GB/s of weight bytes read, the bf16 dense F.linear for comparison, and per format
the smallest M from which the tile path wins on most shapes (what `PREFILL_ROWS` should be).

    .venv/bin/python playground/qmatmul_bench.py [--formats Q4_0,Q8_0] [--ms 1,8,32] [--budget 0.15] [--threads 1] [--cold]

--cold: each call reads another copy of the weight, the copies together past the L3 cache, so the
weights stream from DRAM as a model's do (a model does not fit L3; one weight timed again and again
does, and hides whether the kernel keeps up with memory: the prefetch in qmatmul_r16).
"""

from __future__ import annotations

import argparse
import itertools
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from slotserver.runtime import cpu_features
from slotserver.runtime.kernel_set import KERNEL_CONTRACT
from slotserver.runtime.loader import load_by_path
from slotserver.runtime.qblocks import QUANTIZED, T, random_qweight

SHAPES = [(576, 576), (576, 1536), (1536, 576), (576, 49152), (896, 4864)]   # (K, N): SmolLM2-135M, a 0.5B
MS = [1, 2, 4, 8, 16, 32, 64, 128]
DEFAULT_FORMATS = "Q4_0,Q8_0,Q4_1,Q4_K,Q6_K,Q5_0,Q5_K,Q5_1,Q3_K,Q2_K"


def timeit(fn, budget: float) -> float:
    """Median seconds per call over calls filling `budget` (one warm-up call first)."""
    fn()
    times, start = [], time.perf_counter()
    while time.perf_counter() - start < budget or len(times) < 3:
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2]


COLD_BYTES = 96 << 20   # weight copies per shape with --cold: past a 32 MiB L3 three times over


def bench_format(mod, qtype, ms, budget: float, dtype, cold: bool = False) -> dict[int, int]:
    """Rows per shape and M; -> {M: shapes on which the tile path won}."""
    wins = {m: 0 for m in ms}
    for k, n in SHAPES:
        k = k if qtype not in (T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K) or k % 256 == 0 else k // 256 * 256 + 256 * (k % 256 > 0)
        gen = torch.Generator().manual_seed(0)
        w = random_qweight(gen, qtype, n, k)
        copies = [w] + [random_qweight(gen, qtype, n, k) for _ in range(COLD_BYTES // w.raw.numel() if cold else 0)]
        ws = itertools.cycle(copies)
        dense = torch.randn(n, k, dtype=torch.bfloat16)
        wbytes = w.raw.numel()
        for m in ms:
            x = torch.randn(m, k).to(dtype)
            for c in copies:   # each copy's repacked form built before the clock
                mod._int_dots(x, c)
            t_int = timeit(lambda: mod._int_dots(x, next(ws)), budget)
            t_deq = timeit(lambda: mod._dequant_tiles(x, next(ws)), budget)
            t_bf16 = timeit(lambda: F.linear(x.bfloat16(), dense), budget)
            flop = 2 * m * n * k
            wins[m] += t_deq < t_int
            print(f"{w.name:5} K={k:5} N={n:6} M={m:4}  int {flop / t_int / 1e9:7.1f} GFLOP/s {wbytes / t_int / 1e9:6.2f} GB/s"
                  f"  | tiles {flop / t_deq / 1e9:7.1f} GFLOP/s  | bf16 dense {flop / t_bf16 / 1e9:7.1f} GFLOP/s"
                  f"  {'tiles' if t_deq < t_int else 'int'}", flush=True)
    return wins


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--formats", default=DEFAULT_FORMATS)
    ap.add_argument("--ms", default=",".join(map(str, MS)))
    ap.add_argument("--budget", type=float, default=0.15, help="seconds of timing per case")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--threads", type=int, default=0, help="torch/OpenMP threads (0: torch's default)")
    ap.add_argument("--cold", action="store_true", help="weights streamed from DRAM (copies cycled past L3)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    mod = load_by_path(Path(__file__).parents[1] / "kernels" / "qmatmul.py", KERNEL_CONTRACT).module
    assert mod._LIB is not None, "no native library (compiler missing or SLOTSERVER_NATIVE=0)"
    feats = cpu_features.current()
    vnni = "avx512_vnni" in feats.flags and "avx512vl" in feats.flags and feats.variant != "avx2"
    print(f"variant {feats.variant} ({'VNNI dpbusd' if vnni else 'AVX2 maddubs'}), torch threads {torch.get_num_threads()}, "
          f"x {args.dtype}{', weights from DRAM' if args.cold else ''}; flags: {' '.join(sorted(f for f in feats.flags if f.startswith(('avx2', 'avx512', 'amx'))))}")
    ms, dtype = [int(m) for m in args.ms.split(",")], getattr(torch, args.dtype)
    summary = {}
    for name in args.formats.split(","):
        qtype = T[name]
        assert qtype in QUANTIZED, name
        wins = bench_format(mod, qtype, ms, args.budget, dtype, args.cold)
        summary[name] = next((m for m in ms if wins[m] * 2 > len(SHAPES)), None)
    for name, m in summary.items():
        print(f"crossover {name}: tiles win on most shapes from M = {m} (current PREFILL_ROWS {mod.PREFILL_ROWS[int(T[name])]})")


if __name__ == "__main__":
    main()
