"""GGUF blocks on the GPU (kernels/qmatmul_gpu.py) against cuBLAS on the dense bf16 weight: which wins
per matmul shape, format and batch size? The table `--gpu-weights auto` is to follow (docs/gpu.md).

Shapes: Qwen2.5-0.5B's and Llama-3.1-8B's matmuls (qkv, wo, gate_up, down, output) at M = 1, 8,
32, 64, 512 activation rows, bf16 x; formats Q4_K, Q6_K, Q8_0, Q5_0 (what Q4_K_M / Q8_0 files
hold). Weights are random valid blocks made on the card (a kernel's time does not depend on the
values); the first rows of each are checked against gguf's dequantizer. Times: triton's
do_bench_cudagraph (launch overhead removed; L2 warm, so weights under the 50 MB L2 read fast) and
do_bench (eager, L2 flushed). GB/s: the format's weight bytes over the graph time, beside the
device-to-device copy's read + write rate measured in the same run. "win": blocks or cublas.
"other_gemm" (past 16 rows): the GEMM path qmatmul_gpu did not pick (tiled tl.dot below
DEQUANT_GEMM_ROWS, dequantized tiles + cuBLAS from it), to place that threshold. "wide" (1..8 rows,
Q4_K / Q6_K / Q8_0 / Q5_0): the same call with the module's QGEMV = "wide" (the default: x quantized
to q8_1, 16-byte weight loads, dp4a; its own launch for x included), beside the "slices" kernel;
"mma" (2..16 rows of Q4_K and Q6_K): QMMA = "int8" (x's q8_1 rows times the unpacked values on int8
tensor cores); GB/s and % of the copy rate for each, "win" among the four.

    PYTHONPATH=. python playground/gpu_qmatmul_bench.py [--out DIR] [--budget-s 60] [--rep-ms 10] [--tune S]
    TRITON_INTERPRET=1 PYTHONPATH=. python playground/gpu_qmatmul_bench.py --dry-run --out /tmp/qb   # CPU

--tune S: first up to S seconds on the decode settings `plan` reads (GEMV column block and warps,
programs per SM; the 2-16 row column block) and the wide GEMV's (`wide_plan`: weight words a step,
programs per SM, warps), Q4_K at 1 and 8 rows on four shapes: the best per shape is printed, to be
written into kernels/qmatmul_gpu.py.
--dry-run: tiny shapes in the interpreter, one perf_counter call per timing: checks the script only.
With --out: DIR/gpu_qmatmul_bench.{txt,json}. A failing case prints one line and the run goes on.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import gguf
import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
for _p in (ROOT, ROOT / "playground"):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

from gpu_attention_bench import Timer, copy_bandwidth, fmt_row  # noqa: E402
from slotserver.runtime.kernel_set import KERNEL_CONTRACT  # noqa: E402
from slotserver.runtime.loader import default_dir, load_by_path  # noqa: E402
from slotserver.runtime.qblocks import F16_FIELDS, T, QWeight, dequantize  # noqa: E402

# (n, k) per matmul: qkv = q + 2 kv heads, gate_up = 2 d_ff
SHAPES = {"Qwen0.5B": {"qkv": (1152, 896), "wo": (896, 896), "gate_up": (9728, 896), "down": (896, 4864),
                       "output": (151936, 896)},
          "Llama8B": {"qkv": (6144, 4096), "wo": (4096, 4096), "gate_up": (28672, 4096), "down": (4096, 14336),
                      "output": (128256, 4096)}}
DRY_SHAPES = {"tiny": {"qkv": (48, 256), "down": (40, 512)}}
ROWS, DRY_ROWS = (1, 8, 32, 64, 512), (1, 8, 20)
FORMATS = (T.Q4_K, T.Q6_K, T.Q8_0, T.Q5_0)
WIDTHS = [9, 8, 6, 5, 10, 10, 10, 10, 10, 10, 10, 10, 9, 9, 6, 7, 7, 7]


def random_blocks(qtype: T, n: int, k: int, device: str, gen: torch.Generator) -> QWeight:
    """Random quant bytes with finite float16 scales (0.002 +- 50%), made on `device`."""
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    raw = torch.randint(0, 256, (n * k // block, size), generator=gen, dtype=torch.uint8, device=device)
    scale = (0.002 * (0.5 + torch.rand(raw.shape[0], generator=gen, device=device))).to(torch.float16)
    for off in F16_FIELDS[qtype]:
        raw[:, off:off + 2] = scale.view(torch.uint8).view(-1, 2)
    return QWeight(raw.view(n, k // block * size), int(qtype), k, n)


def check(mod, w: QWeight, device: str) -> float:
    """Max |kernel - exact| / (1 + max |exact|) on the first 64 rows (gguf's dequantizer), 3 rows of x."""
    part = QWeight(w.raw[:64].contiguous(), w.qtype, w.k, min(64, w.n))
    x = torch.randn(3, w.k, device=device).to(torch.bfloat16)
    ref = x.float().cpu().double() @ dequantize(part).double().T
    y = mod.triton(x, part).float().cpu().double()
    return float((y - ref).abs().max()) / (1 + float(ref.abs().max()))


def with_switch(mod, name: str, mode: str, fn):
    """fn() with the module's switch `name` (QGEMV, QMMA) set to `mode` (restored after)."""
    saved = getattr(mod, name)
    setattr(mod, name, mode)
    try:
        return fn()
    finally:
        setattr(mod, name, saved)


def with_qgemv(mod, mode: str, fn):
    """fn() with QGEMV = mode and the int8 product off: the slices and wide columns time those alone."""
    return with_switch(mod, "QMMA", "off", lambda: with_switch(mod, "QGEMV", mode, fn))


def with_qmma(mod, fn):
    """fn() with the int8 tensor-core product on (QMMA = "int8") from 2 rows (its column times the
    product itself at every row count it can serve, whatever MMA_MIN_M routes to it)."""
    every = dict.fromkeys(mod.mma.MMA_MIN_M, 2)
    return with_switch(mod.mma, "MMA_MIN_M", every, lambda: with_switch(mod, "QMMA", "int8", fn))


def mma_serves(mod, x: torch.Tensor, w: QWeight) -> bool:
    return with_qmma(mod, lambda: mod._mma_ok(x, w))


def wide_serves(mod, x: torch.Tensor, w: QWeight) -> bool:
    """Whether QGEMV = "wide" serves this call (else its column is nan, not the slices timed twice)."""
    return with_qgemv(mod, "wide", lambda: mod._wide_ok(x, w))


def other_gemm(mod, timer: Timer, m: int, fn) -> float:
    """Past SMALL_M rows: the time of the GEMM path `plan` did not pick (the tiled tl.dot below
    DEQUANT_GEMM_ROWS, dequantized tiles + cuBLAS from it), to place that threshold; else nan."""
    slices = mod.slices
    if m <= slices.SMALL_M:
        return float("nan")
    saved = slices.DEQUANT_GEMM_ROWS
    slices.DEQUANT_GEMM_ROWS = (1 << 30) if m >= saved else slices.SMALL_M + 1
    try:
        us = timer.graph(fn)
        return us if us == us else timer.eager(fn)
    finally:
        slices.DEQUANT_GEMM_ROWS = saved


def bench_shape(mod, timer: Timer, qtype: T, n: int, k: int, rows: tuple[int, ...], device: str, gen,
                deadline: float = float("inf")) -> list[dict]:
    """Each row count of `rows` until `deadline` (perf_counter): both times of each path."""
    w = random_blocks(qtype, n, k, device, gen)
    err = with_qgemv(mod, "slices", lambda: check(mod, w, device))
    probe = torch.zeros(3, k, device=device, dtype=torch.bfloat16)
    wide_err = with_qgemv(mod, "wide", lambda: check(mod, w, device)) if wide_serves(mod, probe, w) else float("nan")
    mma_err = with_qmma(mod, lambda: check(mod, w, device)) if mma_serves(mod, probe, w) else float("nan")
    dense = torch.randn(n, k, generator=gen, device=device).to(torch.bfloat16)   # timing only
    out, nan = [], float("nan")
    for m in rows:
        if time.perf_counter() > deadline:
            break
        x = torch.randn(m, k, generator=gen, device=device).to(torch.bfloat16)
        ours = with_qgemv(mod, "slices", lambda: [timer.graph(lambda: mod.triton(x, w)), timer.eager(lambda: mod.triton(x, w))])
        wide = with_qgemv(mod, "wide", lambda: [timer.graph(lambda: mod.triton(x, w)), timer.eager(lambda: mod.triton(x, w))]) \
            if wide_serves(mod, x, w) else [nan, nan]
        mma = with_qmma(mod, lambda: [timer.graph(lambda: mod.triton(x, w)), timer.eager(lambda: mod.triton(x, w))]) \
            if mma_serves(mod, x, w) else [nan, nan]
        cublas = [timer.graph(lambda: F.linear(x, dense)), timer.eager(lambda: F.linear(x, dense))]
        other = other_gemm(mod, timer, m, lambda: mod.triton(x, w))
        wbytes = w.raw.numel()
        key = 0 if ours[0] == ours[0] else 1   # graph time where it exists (nan on the dry run)
        times = {"slices": ours[key], "wide": wide[key], "mma": mma[key], "cublas": cublas[key]}
        out.append(dict(qtype=qtype.name, n=n, k=k, m=m, blocks_graph_us=ours[0], blocks_eager_us=ours[1],
                        wide_graph_us=wide[0], wide_eager_us=wide[1], mma_graph_us=mma[0], mma_eager_us=mma[1],
                        mma_gbs=wbytes / mma[key] / 1e3, cublas_graph_us=cublas[0], cublas_eager_us=cublas[1],
                        weight_bytes=wbytes, other_gemm_us=other, blocks_gbs=wbytes / ours[key] / 1e3,
                        wide_gbs=wbytes / wide[key] / 1e3, cublas_gbs=2 * n * k / cublas[key] / 1e3,
                        win=min((t, name) for name, t in times.items() if t == t)[1], rel_err=err, wide_rel_err=wide_err, mma_rel_err=mma_err))
    del w, dense
    return out


TUNE_SHAPES = {"Qwen0.5B down": (896, 4864), "Qwen0.5B gate_up": (9728, 896), "Llama8B gate_up": (28672, 4096),
               "Llama8B down": (4096, 14336)}
WIDE_TUNE = {1: [dict(QGEMV="wide", QMMA="off", WIDE_WORDS=words, WIDE_PROGRAMS_PER_SM=p, WIDE_WARPS=warps)
                 for words in (1024, 2048) for p in (1, 2, 4) for warps in (4, 8)],   # ~1 s a compile
             8: [dict(QGEMV="wide", QMMA="off", WIDE_WORDS=words, WIDE_PROGRAMS_PER_SM=p, WIDE_ROWS_WARPS=warps)
                 for words in (1024, 2048) for p in (2, 4) for warps in (4, 8) if words * 4 // warps <= 1024]}
# the int8 tensor-core product's (QMMA, the default from MMA_MIN_M rows) at 2..16 rows
MMA_TUNE = [dict(QMMA="int8", MMA_MIN_M={T.Q4_K: 2, T.Q6_K: 2}, MMA_BLOCK_N={T.Q4_K: bn, T.Q6_K: 32},   # Q4_K tuned
                 MMA_PROGRAMS_PER_SM=p, MMA_WARPS=w)
            for bn, p, w in [(bn, p, 4) for bn in (32, 64, 128) for p in (1, 2, 4)] + [(64, 2, 8), (128, 2, 8)]]
# 8 rows first (the int8 product, then the wide kernel), then one row; each the serving slices kernel's last
TUNE = {8: MMA_TUNE + WIDE_TUNE[8] + [dict(QGEMV="slices", QMMA="off", DECODE_BLOCK_N=bn, PROGRAMS_PER_SM=p)
                                      for bn in (32, 64) for p in (2, 4, 8)],
        1: WIDE_TUNE[1] + [dict(QGEMV="slices", QMMA="off", GEMV_BLOCK_N=bn, GEMV_WARPS=w, PROGRAMS_PER_SM=p)
                           for bn in (32, 64, 128) for w in (4, 8) for p in (2, 4, 8)]}


def owner(mod, name: str):
    """The module that holds tuning constant `name`: qmatmul_gpu itself (its switches) or the part
    whose product reads it (kernels/_qmatmul_gpu_{slices,wide,mma}.py)."""
    return next(m for m in (mod, mod.slices, mod.wide, mod.mma) if hasattr(m, name))


def tune(mod, timer: Timer, device: str, gen, budget_s: float, dry: bool, shapes: str = "", wide_only: bool = False
         ) -> list[dict]:
    """Q4_K (Q5_0 at K = 896) at 1 and 8 rows under each decode setting (module constants `plan` reads): graph us."""
    t0, rows = time.perf_counter(), []
    saved = {k: getattr(owner(mod, k), k) for settings in TUNE.values() for s in settings for k in s}
    names = [n.strip() for n in shapes.split(",") if n.strip()] or list(TUNE_SHAPES)
    shapes = {"tiny": (40, 512)} if dry else {n: TUNE_SHAPES[n] for n in names}
    table = {m: [s for s in settings if not wide_only or s.get("QGEMV") == "wide" or s.get("QMMA") == "int8"]
             for m, settings in TUNE.items()}
    for name, (n, k) in shapes.items():   # Q4_K where K is whole super-blocks, else Q5_0 (a Q4_K_M file's fallback)
        w = random_blocks(T.Q4_K if k % 256 == 0 else T.Q5_0, n, k, device, gen)
        for m, settings in table.items():
            x = torch.randn(m, k, generator=gen, device=device).to(torch.bfloat16)
            for setting in settings[:1] + settings[-1:] if dry else settings:
                if time.perf_counter() - t0 > budget_s:
                    return rows
                for key, value in setting.items():
                    setattr(owner(mod, key), key, value)
                us = timer.graph(lambda: mod.triton(x, w))
                us = us if us == us else timer.eager(lambda: mod.triton(x, w))
                mode = "mma" if setting.get("QMMA") == "int8" else setting.get("QGEMV", "slices")
                rows.append(dict(shape=name, m=m, us=us, gbs=w.raw.numel() / us / 1e3, **{**setting, "QGEMV": mode}))
                print(f"tune {name} M={m} {setting}: {us:.1f} us, {rows[-1]['gbs']:.0f} GB/s", flush=True)
                for key, value in saved.items():
                    setattr(owner(mod, key), key, value)
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dry-run", action="store_true", help="tiny shapes on the CPU (run under TRITON_INTERPRET=1)")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--budget-s", type=float, default=60.0, help="stop starting new shapes after this many seconds")
    ap.add_argument("--rep-ms", type=int, default=10)
    ap.add_argument("--tune", type=float, default=0.0, metavar="S",
                    help="first spend up to S seconds timing decode settings (Q4_K, 1 and 8 rows)")
    ap.add_argument("--rows", default="", help="comma-separated activation row counts (default 1,8,32,64,512)")
    ap.add_argument("--formats", default="", help="comma-separated GGUF formats to time (default Q4_K,Q6_K,Q8_0,Q5_0)")
    ap.add_argument("--tune-shapes", default="", help=f"comma-separated, of: {', '.join(TUNE_SHAPES)} (default all)")
    ap.add_argument("--tune-wide-only", action="store_true",
                    help="tune only the wide GEMV's and the int8 tensor-core product's settings")
    args = ap.parse_args(argv)
    start = time.perf_counter()   # --budget-s counts from here (the tuning has its own)
    device = "cpu" if args.dry_run else "cuda"
    mod = load_by_path(default_dir("kernels") / "qmatmul_gpu.py", KERNEL_CONTRACT).module
    timer, gen = Timer(args.dry_run, args.rep_ms), torch.Generator(device=device).manual_seed(0)
    copy = copy_bandwidth(timer, device)
    head = f"qmatmul_gpu vs cuBLAS bf16 on {torch.cuda.get_device_name() if device == 'cuda' else 'cpu (dry run)'}; " \
           f"copy {copy:.0f} GB/s (read + write)"
    lines = [head, fmt_row(["model", "matmul", "fmt", "M", "slices_gr", "wide_gr", "mma_gr", "cublas_gr", "slices_eag",
                            "wide_eag", "cublas_eag", "other_gemm", "slc_GB/s", "wide_GB/s", "%copy", "%copy_w",
                            "%copy_m", "win"], WIDTHS)]
    print("\n".join(lines), flush=True)
    tuned = tune(mod, timer, device, gen, args.tune, args.dry_run, args.tune_shapes, args.tune_wide_only) if args.tune else []
    for m, shape, mode in dict.fromkeys((r["m"], r["shape"], r["QGEMV"]) for r in tuned):   # the best of each kernel
        best = min((r for r in tuned if r["m"] == m and r["shape"] == shape and r["QGEMV"] == mode), key=lambda r: r["us"])
        lines.append(f"tune best {shape} M={m} {mode}: {best}")
        print(lines[-1], flush=True)
    t0 = time.perf_counter() if args.tune else start   # the budget: from the start, or after the tuning
    rows, results = DRY_ROWS if args.dry_run else ROWS, []
    rows = tuple(int(r) for r in args.rows.split(",")) if args.rows else rows
    formats = [q for q in FORMATS if not args.formats or q.name in args.formats.split(",")]
    cases = [(qtype, model, name, nk) for qtype in formats   # Q4_K first: what a Q4_K_M file mostly is
             for model, shapes in (DRY_SHAPES if args.dry_run else SHAPES).items() for name, nk in shapes.items()
             if nk[1] % gguf.GGML_QUANT_SIZES[qtype][0] == 0]   # Q4_K / Q6_K need K in whole 256-blocks (Qwen's 896: not)
    for qtype, model, name, (n, k) in cases:
        if time.perf_counter() - t0 > args.budget_s:
            lines.append(f"budget of {args.budget_s:.0f} s spent: {len(cases) - cases.index((qtype, model, name, (n, k)))} "
                         "shapes not timed")
            print(lines[-1], flush=True)
            break
        try:
            for r in bench_shape(mod, timer, qtype, n, k, rows, device, gen, t0 + args.budget_s):
                r.update(model=model, matmul=name)
                results.append(r)
                lines.append(fmt_row([model, name, r["qtype"], r["m"], f"{r['blocks_graph_us']:.1f}", f"{r['wide_graph_us']:.1f}",
                                      f"{r['mma_graph_us']:.1f}", f"{r['cublas_graph_us']:.1f}", f"{r['blocks_eager_us']:.1f}",
                                      f"{r['wide_eager_us']:.1f}",
                                      f"{r['cublas_eager_us']:.1f}", f"{r['other_gemm_us']:.1f}", f"{r['blocks_gbs']:.0f}",
                                      f"{r['wide_gbs']:.0f}", f"{100 * r['blocks_gbs'] / copy:.0f}%",
                                      f"{100 * r['wide_gbs'] / copy:.0f}%", f"{100 * r['mma_gbs'] / copy:.0f}%", r["win"]], WIDTHS))
                print(lines[-1], flush=True)
        except Exception as e:  # noqa: BLE001 - one failing case costs a line, not the run
            lines.append(f"{model} {name} {qtype.name}: FAILED {type(e).__name__}: {str(e)[:200]}")
            print(lines[-1], flush=True)
    bad = [r for r in results if max(r["rel_err"], r["wide_rel_err"], r["mma_rel_err"]) > 2e-2]   # nan (no kernel) passes
    lines.append(f"{len(results)} rows; numerics vs gguf (slices, wide, mma): "
                 f"{'all within 2e-2' if not bad else f'{len(bad)} FAILED'}")
    print(lines[-1])
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "gpu_qmatmul_bench.txt").write_text("\n".join(lines) + "\n")
        (args.out / "gpu_qmatmul_bench.json").write_text(json.dumps({"copy_gbs": copy, "rows": results, "tune": tuned}, indent=1))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
