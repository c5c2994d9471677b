"""Elementwise and prefill-attention Triton kernels against the card: are they bandwidth- and SDPA-bound?

The issue's targets: rms_norm, rope, silu_mul and gelu_mul at >= 70% of the device-to-device copy
bandwidth, and prefill attention at >= 0.8x the throughput of torch's SDPA at 2048 tokens. Each
kernel file (kernels/*.py, loaded by path as the lab loads them) is called through its `triton`
function on serving shapes, bf16: tokens 8192, 2048, 64, 1 x Qwen2.5-0.5B / Llama-3-8B widths
(rms_norm d 896 / 4096 with a float32 weight, as the model keeps norms; silu_mul / gelu_mul
[T, 2*d_ff], d_ff 4864 / 14336; rope on the q|k heads of a fused qkv row, 14+2 x 64 / 32+8 x 128,
float32 cos/sin [T, head_dim/2] as the model's rope table makes them). Bytes moved = every input
read + the output written; GB/s and % of the copy bandwidth (measured in the same run, read +
write, as playground/gpu_attention_bench.py does), next to torch's eager equivalent. Prefill
attention: B = 1 and 4 fresh sequences of 2048 tokens (positions 0..2047, a seq_head_dim cache),
Qwen (14 q / 2 kv heads, d 64) and Llama-8B (32/8, d 128), ours vs SDPA causal (enable_gqa) on
contiguous [B, H, L, D]; TFLOP/s counts 4*L*L*H*D/2 per sequence. Times: triton's do_bench (L2
flushed; the targets use these) and do_bench_cudagraph (launch overhead removed, L2 warm).

    PYTHONPATH=. python playground/gpu_kernel_bench.py [--out DIR] [--budget-s 60] [--rep-ms 25]
    TRITON_INTERPRET=1 PYTHONPATH=. python playground/gpu_kernel_bench.py --dry-run --out /tmp/kb  # CPU

--dry-run: tiny shapes in the Triton interpreter on the CPU, one perf_counter-timed call per
measurement and the copy bandwidth faked as 1 GB/s: it checks the script, not the kernels' speed.
With --out: DIR/gpu_kernel_bench.{txt,json}. A failing case prints one line and the run goes on.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
for _p in (ROOT, ROOT / "playground"):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

from gpu_attention_bench import Timer, copy_bandwidth, fmt_row  # noqa: E402
from slotserver.runtime.batch import Batch, SeqChunk  # noqa: E402
from slotserver.runtime.kernel_set import KERNEL_CONTRACT  # noqa: E402
from slotserver.runtime.kv_spec import PagedKV, StridedKV  # noqa: E402
from slotserver.runtime.loader import default_dir, load_by_path  # noqa: E402

OPS = ("rms_norm", "silu_mul", "gelu_mul", "rope", "attention", "paged_attention")
PAGE = 16
WIDTHS = {"rms_norm": {"Qwen0.5B": 896, "Llama8B": 4096}, "rms_norm_add": {"Qwen0.5B": 896, "Llama8B": 4096},
          "silu_mul": {"Qwen0.5B": 4864, "Llama8B": 14336},
          "gelu_mul": {"Qwen0.5B": 4864, "Llama8B": 14336}, "rope": {"Qwen0.5B": (14, 2, 64), "Llama8B": (32, 8, 128)}}
DRY_WIDTHS = {"rms_norm": {"Qwen0.5B": 96}, "rms_norm_add": {"Qwen0.5B": 96}, "silu_mul": {"Qwen0.5B": 80}, "gelu_mul": {"Llama8B": 48},
              "rope": {"Qwen0.5B": (3, 1, 16), "Llama8B": (4, 2, 32)}}
TOKENS_FIRST, TOKENS_LAST = (8192, 2048), (64, 1)   # the bandwidth-bound sizes run before the attention
DRY_TOKENS_FIRST, DRY_TOKENS_LAST = (7,), (1,)
ATTN = {"Qwen0.5B": (2, 14, 64), "Llama8B": (8, 32, 128)}   # kv heads, q heads, head_dim
DRY_ATTN = {"Qwen0.5B": (1, 3, 16), "Llama8B": (2, 4, 32)}
ATTN_BATCHES, ATTN_LEN, DRY_ATTN_LEN = (1, 4), 2048, 48   # lengths: whole 16-cell pages
COPY_TARGET, SDPA_TARGET, REL_ERR_MAX = 0.70, 0.80, 2e-2
EPS = 1e-6


def rms_case(mod, d: int, t: int, dev: str, gen: torch.Generator):
    x = torch.randn(t, d, generator=gen, device=dev).to(torch.bfloat16)
    w = 1 + 0.1 * torch.randn(d, generator=gen, device=dev)                       # float32, as the model's norms
    return (lambda: mod.triton(x, w, EPS), lambda: F.rms_norm(x.float(), (d,), w, EPS).to(x.dtype),
            2 * x.numel() * 2 + w.numel() * 4, f"x[{t},{d}] w f32")


def rms_add_case(mod, d: int, t: int, dev: str, gen: torch.Generator):
    """What the lean body serves (model/lean_step.py): the float32 residual x += y (bf16), then x
    normed into bf16 rows, one launch; x is restored before each call (outside the bytes)."""
    x0 = torch.randn(t, d, generator=gen, device=dev)
    y = torch.randn(t, d, generator=gen, device=dev).to(torch.bfloat16)
    w = 1 + 0.1 * torch.randn(d, generator=gen, device=dev)
    x = x0.clone()

    def ours():
        return mod.triton(x, w, EPS, add=y, out_dtype=torch.bfloat16)

    def eager():
        xs = x0 + y.float()
        return F.rms_norm(xs, (d,), w, EPS).to(torch.bfloat16)

    def checked():   # the first call's output, from x0 (timed calls keep adding y: the bytes are the same)
        x.copy_(x0)
        return ours()

    return checked, eager, ours, 2 * x.numel() * 4 + y.numel() * 2 + x.numel() * 2 + w.numel() * 4, \
        f"x[{t},{d}] f32 += y bf16 -> bf16"


def glu_case(mod, d_ff: int, t: int, dev: str, gen: torch.Generator, gelu: bool):
    gu = (2 * torch.randn(t, 2 * d_ff, generator=gen, device=dev)).to(torch.bfloat16)
    g, u = gu.chunk(2, dim=-1)
    eager = (lambda: F.gelu(g, approximate="tanh") * u) if gelu else (lambda: F.silu(g) * u)
    return lambda: mod.triton(gu), eager, gu.numel() * 2 + t * d_ff * 2, f"gu[{t},{2 * d_ff}]"


def rope_case(mod, heads: tuple, t: int, dev: str, gen: torch.Generator):
    hq, hkv, hd = heads
    qkv = torch.randn(t, (hq + 2 * hkv) * hd, generator=gen, device=dev).to(torch.bfloat16)
    x = qkv[:, : (hq + hkv) * hd].view(t, hq + hkv, hd)                            # q|k heads, strided rows
    angle = torch.rand(t, hd // 2, generator=gen, device=dev) * 100
    cos, sin = angle.cos(), angle.sin()                                            # float32 [T, hd/2]

    def eager():
        x0, x1 = x.float().unflatten(-1, (-1, 2)).unbind(-1)
        c, s = cos.unsqueeze(1), sin.unsqueeze(1)
        return torch.stack((x0 * c - x1 * s, x0 * s + x1 * c), dim=-1).flatten(-2).to(x.dtype)

    return (lambda: mod.triton(x, cos, sin), eager, 2 * x.numel() * 2 + 2 * cos.numel() * 4,
            f"x[{t},{hq}+{hkv},{hd}] view, cs f32")


def make_elementwise(mods: dict, op: str, width, t: int, dev: str):
    gen = torch.Generator(device=dev).manual_seed(t)
    if op == "rms_norm":
        return rms_case(mods[op], width, t, dev, gen)
    if op == "rms_norm_add":
        return rms_add_case(mods["rms_norm"], width, t, dev, gen)
    if op == "rope":
        return rope_case(mods[op], width, t, dev, gen)
    return glu_case(mods[op], width, t, dev, gen, gelu=op == "gelu_mul")


def sdpa_fn(q, k, v, scale: float):
    """SDPA causal with native GQA; where enable_gqa is refused, K/V repeated once, outside the timing."""
    try:
        F.scaled_dot_product_attention(q[:, :, :16], k[:, :, :16], v[:, :, :16], is_causal=True, enable_gqa=True)
        return (lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale, enable_gqa=True)), ""
    except (TypeError, RuntimeError) as e:
        group = q.shape[1] // k.shape[1]
        kr, vr = (x.repeat_interleave(group, dim=1) for x in (k, v))
        return (lambda: F.scaled_dot_product_attention(q, kr, vr, is_causal=True, scale=scale),
                f"SDPA without enable_gqa ({type(e).__name__}): K/V repeated")


def attn_case(mod, geo: tuple, batch: int, length: int, dev: str, paged: bool = False):
    """B fresh sequences of `length` tokens: q [B*L, Hq, D], cache [B, L, Hkv, D] (paged: as pages);
    SDPA's [B, H, L, D] twins."""
    kv_heads, q_heads, hd = geo
    gen = torch.Generator(device=dev).manual_seed(batch)
    q = torch.randn(batch * length, q_heads, hd, generator=gen, device=dev).to(torch.bfloat16)
    k, v = (torch.randn(batch, length, kv_heads, hd, generator=gen, device=dev).to(torch.bfloat16) for _ in range(2))
    meta = Batch.build([SeqChunk(stream=b, start=0, tokens=[0] * length) for b in range(batch)], device=dev).attn
    kv, scale = StridedKV(k, v), 1 / math.sqrt(hd)
    if paged:   # the same cells as 16-cell pages, each sequence's pages in order
        pages = [x.reshape(batch * length // PAGE, PAGE, kv_heads, hd) for x in (k, v)]
        table = torch.arange(batch * length // PAGE, device=dev, dtype=torch.int32).view(batch, -1)
        kv = PagedKV(pages[0], pages[1], table, PAGE)
    qs = q.view(batch, length, q_heads, hd).transpose(1, 2).contiguous()
    ks, vs = (x.transpose(1, 2).contiguous() for x in (k, v))
    sdpa, note = sdpa_fn(qs, ks, vs, scale)
    ours = lambda: mod.triton(q, kv, meta, scale)  # noqa: E731
    flops = batch * 4 * length * length * q_heads * hd / 2
    return ours, (lambda: sdpa().transpose(1, 2).reshape(batch * length, q_heads, hd)), sdpa, flops, note


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).abs().max() / b.float().abs().max().clamp(min=1e-6))


def run_elementwise(mods, op, model, width, t, dev, timer, copy_gbs) -> dict:
    case = make_elementwise(mods, op, width, t, dev)
    if len(case) == 5:   # (first call, torch, timed call, bytes, shape): the timed call changes its input
        first, eager, ours, nbytes, shape = case
        err = rel_err(first(), eager())
    else:
        ours, eager, nbytes, shape = case
        err = rel_err(ours(), eager())
    us, gus, tus, tgus = timer.eager(ours), timer.graph(ours), timer.eager(eager), timer.graph(eager)
    gbs, tgbs = nbytes / us / 1e3, nbytes / tus / 1e3
    return {"kind": "elementwise", "op": op, "model": model, "tokens": t, "shape": shape, "bytes": nbytes,
            "us": us, "graph_us": gus, "gbs": gbs, "copy_frac": gbs / copy_gbs, "torch_us": tus,
            "torch_graph_us": tgus, "torch_copy_frac": tgbs / copy_gbs, "speedup_vs_torch": tus / us, "rel_err": err}


def run_attention(mods, model, geo, batch, length, dev, timer, paged: bool = False, sdpa_times: dict | None = None,
                  graph: bool = True) -> dict:
    """One prefill case: ours and SDPA, eager and (graph) replayed. sdpa_times: SDPA's times per
    (model, batch), measured once and reused (the tile sweep times only ours)."""
    op = "paged_attention" if paged else "attention"
    ours, sdpa_flat, sdpa, flops, note = attn_case(mods[op], geo, batch, length, dev, paged)
    err = rel_err(ours(), sdpa_flat())
    us, gus = timer.eager(ours), timer.graph(ours) if graph else float("nan")
    key = (model, batch)
    if sdpa_times is None or key not in sdpa_times:
        times = timer.eager(sdpa), timer.graph(sdpa)
        if sdpa_times is not None:
            sdpa_times[key] = times
    sus, sgus = times if sdpa_times is None else sdpa_times[key]
    return {"kind": "attention", "op": op, "model": model, "batch": batch, "tokens": length,
            "geometry": f"{geo[1]}q/{geo[0]}kv d{geo[2]}", "us": us, "graph_us": gus, "tflops": flops / us / 1e6,
            "sdpa_us": sus, "sdpa_graph_us": sgus, "sdpa_tflops": flops / sus / 1e6, "vs_sdpa": sus / us,
            "rel_err": err, "note": note}


EW_HEAD = (["op", "model", "shape", "us", "graph us", "GB/s", "%copy", "torch us", "t graph", "t %copy", "x torch",
            "rel err"], [8, 8, 28, 8, 8, 6, 5, 8, 8, 7, 7, 7])
AT_HEAD = (["attention", "model", "geometry", "BxL", "us", "graph us", "TFLOP/s", "SDPA us", "SDPA graph", "SDPA TF/s",
            "ours/SDPA", "rel err"], [9, 8, 14, 7, 8, 8, 7, 8, 10, 9, 9, 7])


def row_cells(r: dict) -> list:
    if r["kind"] == "attention":
        return ["prefill" if r["op"] == "attention" else "paged", r["model"], r["geometry"], f"{r['batch']}x{r['tokens']}", f"{r['us']:.1f}",
                f"{r['graph_us']:.1f}", f"{r['tflops']:.1f}", f"{r['sdpa_us']:.1f}", f"{r['sdpa_graph_us']:.1f}",
                f"{r['sdpa_tflops']:.1f}", f"{r['vs_sdpa']:.2f}", f"{r['rel_err']:.1e}"]
    return [r["op"], r["model"], r["shape"], f"{r['us']:.1f}", f"{r['graph_us']:.1f}", f"{r['gbs']:.0f}",
            f"{100 * r['copy_frac']:.0f}", f"{r['torch_us']:.1f}", f"{r['torch_graph_us']:.1f}",
            f"{100 * r['torch_copy_frac']:.0f}", f"{r['speedup_vs_torch']:.2f}", f"{r['rel_err']:.1e}"]


def plan(dry: bool) -> list[tuple]:
    """Cases in priority order: big-token elementwise, prefill attention, then the latency-bound sizes."""
    widths, attn = (DRY_WIDTHS, DRY_ATTN) if dry else (WIDTHS, ATTN)
    first, last = (DRY_TOKENS_FIRST, DRY_TOKENS_LAST) if dry else (TOKENS_FIRST, TOKENS_LAST)
    ew = [[("ew", op, m, w, t) for op, ws in widths.items() for m, w in ws.items()] for t in first + last]
    at = [("attn", op, m, g, b) for op in ("attention", "paged_attention") for b in ATTN_BATCHES
          for m, g in attn.items()]
    # Qwen's narrow rows again at 4x the tokens: at 8192 a call is ~10 us, of which a launch's fixed
    # cost (~4.5 us eager, what a 1-row call takes) is a large share; this shows the bandwidth part
    big = [("ew", op, "Qwen0.5B", widths[op]["Qwen0.5B"], 4 * first[0]) for op in ("rms_norm", "rms_norm_add", "rope")
           if "Qwen0.5B" in widths[op]]
    return sum(ew[: len(first)], []) + at + big + sum(ew[len(first):], [])


def summary(rows: list[dict], say, big: int) -> None:
    """The targets' rows: elementwise at >= `big` tokens (2048; the dry run's sizes there), prefill attention."""
    say()
    say(f"summary: elementwise at >= {big} tokens, % of copy bandwidth (do_bench, L2 flushed; target "
        f">= {100 * COPY_TARGET:.0f}%); prefill attention at {ATTN_LEN} tokens "
        f"(dry run: {DRY_ATTN_LEN}), ours/SDPA throughput (target >= {SDPA_TARGET})")
    for r in rows:
        if r["kind"] == "elementwise" and r["tokens"] >= big:
            ok = r["copy_frac"] >= COPY_TARGET
            say(f"  {r['op']:9s} {r['model']:9s} T={r['tokens']:<5d} {100 * r['copy_frac']:5.1f}% of copy "
                f"(torch {100 * r['torch_copy_frac']:5.1f}%)  {'PASS' if ok else 'MISS'}")
        elif r["kind"] == "attention" and r["op"] == "attention":
            ok = r["vs_sdpa"] >= SDPA_TARGET
            say(f"  prefill   {r['model']:9s} B={r['batch']} L={r['tokens']}  {r['vs_sdpa']:.2f}x SDPA "
                f"({r['tflops']:.1f} vs {r['sdpa_tflops']:.1f} TFLOP/s)  {'PASS' if ok else 'MISS'}")
    bad = [r for r in rows if not r["rel_err"] <= REL_ERR_MAX]
    if bad:
        say(f"  WRONG OUTPUTS: {len(bad)} rows with rel err > {REL_ERR_MAX} (or NaN) against torch")


def setup(args, say):
    """The device, the timer, the copy bandwidth and the kernel modules (None where one fails to load)."""
    import triton

    dev = "cpu" if args.dry_run else "cuda"
    timer = Timer(args.dry_run, args.rep_ms)
    if args.dry_run:
        say(f"DRY RUN: interpreter on the CPU, perf_counter timings; copy bandwidth faked as 1 GB/s "
            f"(torch {torch.__version__}, triton {triton.__version__})")
        copy_gbs = 1.0
    else:
        p = torch.cuda.get_device_properties(0)
        say(f"device: {p.name}, {p.multi_processor_count} SMs, torch {torch.__version__}, triton {triton.__version__}")
        copy_gbs = copy_bandwidth(timer, dev)
        say(f"device-to-device copy: {copy_gbs:.0f} GB/s (read + write)")
    mods = {}
    for op in OPS:
        try:
            mods[op] = load_by_path(default_dir("kernels") / f"{op}.py", KERNEL_CONTRACT).module
        except Exception as e:  # noqa: BLE001 - a kernel file that does not load costs its rows
            say(f"{op}: failed to load: {type(e).__name__}: {str(e)[:200]}")
    return dev, timer, copy_gbs, mods


def run_cases(args, dev, timer, copy_gbs, mods, say, t_start) -> tuple[list, list, list]:
    rows, skipped, failed = [], [], []
    length = DRY_ATTN_LEN if args.dry_run else ATTN_LEN
    last_kind = None
    for kind, op, model, width, n in plan(args.dry_run):
        label = f"{op} {model} {'B=' if kind == 'attn' else 'T='}{n}"
        if time.time() - t_start > args.budget_s or op.removesuffix("_add") not in mods:
            skipped.append(label)
            continue
        if kind != last_kind:
            say(fmt_row(*(AT_HEAD if kind == "attn" else EW_HEAD)))
            last_kind = kind
        try:
            r = (run_attention(mods, model, width, n, length, dev, timer, op == "paged_attention") if kind == "attn"
                 else run_elementwise(mods, op, model, width, n, dev, timer, copy_gbs))
        except Exception as e:  # noqa: BLE001 - one failing case costs its row, not the run
            failed.append(f"{label}: {type(e).__name__}: {str(e)[:300]}")
            say(f"FAILED {failed[-1]}")
        else:
            rows.append(r)
            say(fmt_row(row_cells(r), (AT_HEAD if kind == "attn" else EW_HEAD)[1])
                + (f"  ({r['note']})" if r.get("note") else ""))
        if dev == "cuda":
            torch.cuda.empty_cache()
    return rows, skipped, failed


def run_prefill_tiles(args, dev, timer, mods, say, t_start) -> list[dict]:
    """--prefill-tiles: the prefill cases again under each (BLOCK_M, BLOCK_N, warps, stages) of
    the prefill's 16-bit tiles (kernels/_attention_tl.py's PREFILL16 and PREFILL16_WIDE, as attention.py
    loaded them: head_dim 64 and 128 both),
    to pick each default from measurements (the Qwen rows for the first, Llama's for the second)."""
    op, rows, sdpa_times = mods["attention"], [], {}
    mod = op._tl   # the part attention.py's prefill_tiles reads
    saved = dict(mod.PREFILL16), dict(mod.PREFILL16_WIDE), op.PREFILL_TMA
    length = DRY_ATTN_LEN if args.dry_run else ATTN_LEN
    try:
        for spec in args.prefill_tiles.split(";"):
            fields = spec.split(",")   # BLOCK_M,BLOCK_N,warps,stages[,tma]
            m, n, w, st = (int(x) for x in fields[:4])
            mod.PREFILL16 = mod.PREFILL16_WIDE = {"BLOCK_M": m, "BLOCK_N": n, "num_warps": w, "num_stages": st}
            op.PREFILL_TMA = fields[4:] == ["tma"]
            for b in ATTN_BATCHES:
                for model, geo in (DRY_ATTN if args.dry_run else ATTN).items():
                    if time.time() - t_start > args.budget_s:
                        return rows
                    try:
                        r = run_attention(mods, model, geo, b, length, dev, timer, sdpa_times=sdpa_times)
                    except Exception as e:  # noqa: BLE001
                        say(f"tiles {spec} {model} B={b}: FAILED {type(e).__name__}: {str(e)[:200]}")
                        continue
                    r["tiles"] = spec
                    rows.append(r)
                    say(f"tiles {spec:16s} {model:9s} B={b}  {r['us']:8.1f} us  {r['tflops']:6.1f} TFLOP/s  "
                        f"{r['vs_sdpa']:.2f}x SDPA  graph {r['graph_us']:8.1f} us "
                        f"{r['sdpa_graph_us'] / r['graph_us']:.2f}x SDPA's  err {r['rel_err']:.1e}")
    finally:
        mod.PREFILL16, mod.PREFILL16_WIDE, op.PREFILL_TMA = saved
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dry-run", action="store_true", help="tiny shapes on the CPU (run under TRITON_INTERPRET=1)")
    ap.add_argument("--out", type=Path, default=None, help="folder for gpu_kernel_bench.txt/.json")
    ap.add_argument("--budget-s", type=float, default=60.0, help="start no new case after this many seconds")
    ap.add_argument("--rep-ms", type=int, default=25, help="do_bench repetition time per measurement")
    ap.add_argument("--prefill-tiles", default="",
                    help='e.g. "128,64,8,3;64,64,4,3,tma": prefill under each tiling (",tma": K/V through TMA descriptors)')
    args = ap.parse_args(argv)
    t_start = time.time()
    if not args.dry_run and not torch.cuda.is_available():
        print("no CUDA device: run with --dry-run (and TRITON_INTERPRET=1) on a CPU", file=sys.stderr)
        return 2
    if args.dry_run and os.environ.get("TRITON_INTERPRET") != "1":
        print("--dry-run runs the Triton kernels in the interpreter: set TRITON_INTERPRET=1", file=sys.stderr)
        return 2
    lines: list[str] = []

    def say(text: str = "") -> None:
        print(text, flush=True)
        lines.append(text)

    dev, timer, copy_gbs, mods = setup(args, say)
    rows, skipped, failed = run_cases(args, dev, timer, copy_gbs, mods, say, t_start)
    if args.prefill_tiles:
        rows += run_prefill_tiles(args, dev, timer, mods, say, t_start)
    summary([r for r in rows if "tiles" not in r], say, min(DRY_TOKENS_FIRST if args.dry_run else TOKENS_FIRST))
    if skipped:
        say(f"skipped (time budget {args.budget_s:.0f} s or kernel not loaded): {', '.join(skipped)}")
    if failed:
        say(f"failed cases: {len(failed)}")
    say(f"copy bandwidth {copy_gbs:.0f} GB/s{' (faked, dry run)' if args.dry_run else ''}; "
        f"wall {time.time() - t_start:.0f} s")
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "gpu_kernel_bench.txt").write_text("\n".join(lines) + "\n")
        (args.out / "gpu_kernel_bench.json").write_text(json.dumps(
            {"copy_gbs": copy_gbs, "dry_run": args.dry_run, "rows": rows, "skipped": skipped, "failed": failed,
             "device": "cpu (dry run)" if args.dry_run else torch.cuda.get_device_name(0),
             "torch": torch.__version__, "triton": sys.modules["triton"].__version__}, indent=1))
    return 1 if failed or any(not r["rel_err"] <= REL_ERR_MAX for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
