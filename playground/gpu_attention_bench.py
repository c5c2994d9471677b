"""Decode attention on a GPU: our flash-decoding Triton kernels (kernels/attention.py over the
seq_head_dim and head_seq_dim strided views, kernels/paged_attention.py over 16-cell shuffled
pages, tokens- and heads-first) against torch's SDPA on the same data, and the card's copy bandwidth.

    PYTHONPATH=. python playground/gpu_attention_bench.py [--out DIR] [--tune] [--budget-s 150]
    TRITON_INTERPRET=1 PYTHONPATH=. python playground/gpu_attention_bench.py --dry-run   # CPU, tiny shapes

Per geometry (SmolLM2-135M: 3 KV heads, 9 q heads, d 64; Llama-3-8B: 8 KV heads, 32 q heads,
d 128), batch x context, KV dtype (bf16, f16; q is bf16): microseconds per call (triton's do_bench,
L2 flushed between calls, as issue 34's table), the same under a CUDA graph (launch overhead
removed), KV bytes read per second, its fraction of the measured device-to-device copy bandwidth
(read + write, as issue 34 counts it), the ratio to SDPA (contiguous [B, H, L, D], enable_gqa;
with an f16 cache SDPA runs in f16), the seq_head_dim / head_seq_dim time ratio, and each output's
max abs error against SDPA's. `--tune` then times a few kernel settings (module constants) on
three shapes. Everything goes to stdout and, with --out, to DIR/attention_bench.{txt,json}.

Imports only torch, triton and this repo's kernel loader (no server packages): the kernel files
are loaded by path, as the lab loads them.
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
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from slotserver.runtime.kernel_set import KERNEL_CONTRACT  # noqa: E402
from slotserver.runtime.kv_spec import PagedKV, StridedKV  # noqa: E402
from slotserver.runtime.loader import default_dir, load_by_path  # noqa: E402
from slotserver.runtime.batch import Batch, SeqChunk  # noqa: E402

GEOMETRIES = {  # name: (kv_heads, q_heads, head_dim, [(batch, context), ...])
    "SmolLM2": (3, 9, 64, [(1, 4096), (8, 2048), (32, 2048), (64, 4096)]),
    "Llama-8B": (8, 32, 128, [(1, 4096), (8, 2048), (32, 2048), (64, 4096), (32, 8192)]),
}
DRY_GEOMETRIES = {"SmolLM2": (3, 9, 64, [(1, 96), (3, 48)]), "Llama-8B": (2, 8, 128, [(2, 64)])}
DRY_CONSTANTS = {"DECODE_BLOCK_N": 16, "DECODE_MIN_CHUNK": 16}   # several splits at the dry run's tiny contexts
VIEWS = ("seq_head_dim", "head_seq_dim", "paged", "paged_hnd")
PAGE = 16
KV_NAMES = {torch.bfloat16: "bf16", torch.float16: "f16"}
TUNE = [  # (label, {module constant: value}) applied to both kernel modules
    ("default", {}),
    ("BLOCK_N=32", {"DECODE_BLOCK_N": 32}),
    ("BLOCK_N=128", {"DECODE_BLOCK_N": 128}),
    ("warps=8", {"DECODE_WARPS": 8}),
    ("warps=2", {"DECODE_WARPS": 2}),
    ("stages=2", {"DECODE_STAGES": 2}),
    ("stages=4", {"DECODE_STAGES": 4}),
    ("min_chunk=128", {"DECODE_MIN_CHUNK": 128}),
    ("min_chunk=512", {"DECODE_MIN_CHUNK": 512}),
    ("waves=8", {"DECODE_WAVES": 8}),
    ("waves=2", {"DECODE_WAVES": 2}),
    ("no split", {"DECODE_FORCE_SPLITS": 1}),
    ("broadcast (no dot)", {"DECODE_DOT_MIN_GROUP": 1 << 30}),
]
TUNE_SHAPES = [("SmolLM2", 1, 4096), ("SmolLM2", 32, 2048), ("Llama-8B", 64, 4096)]


def load_kernels():
    kdir = default_dir("kernels")
    return (load_by_path(kdir / "attention.py", KERNEL_CONTRACT).module,
            load_by_path(kdir / "paged_attention.py", KERNEL_CONTRACT).module)


class Timer:
    """do_bench (L2 flushed) and do_bench_cudagraph on a GPU; one timed call on the CPU (dry run)."""

    def __init__(self, dry: bool, rep_ms: int) -> None:
        self.dry, self.rep = dry, rep_ms
        if not dry:
            import triton.testing

            self.testing = triton.testing

    def eager(self, fn) -> float:
        if self.dry:
            fn()
            t = time.perf_counter()
            fn()
            return (time.perf_counter() - t) * 1e6
        return self.testing.do_bench(fn, warmup=max(5, self.rep // 4), rep=self.rep) * 1e3

    def graph(self, fn) -> float:
        if self.dry:
            return float("nan")
        try:
            return self.testing.do_bench_cudagraph(fn, rep=self.rep) * 1e3
        except Exception as e:  # noqa: BLE001 - a capture problem costs a column, not the run
            print(f"  (cuda graph timing failed: {type(e).__name__}: {str(e)[:120]})", flush=True)
            return float("nan")


def copy_bandwidth(timer: Timer, device: str) -> float:
    """GB/s of a device-to-device copy of 1 GiB, read + write bytes (issue 34: 3038 GB/s on an H100)."""
    n = (1 << 30) if not timer.dry else (1 << 20)
    x = torch.empty(n, dtype=torch.uint8, device=device)
    y = torch.empty_like(x)
    us = timer.eager(lambda: y.copy_(x))
    del x, y
    return 2 * n / us / 1e3


class Case:
    """One batch x context x KV dtype: the same K/V in every view, q, the decode AttnMeta, SDPA's output."""

    def __init__(self, kv_heads: int, q_heads: int, dim: int, batch: int, ctx: int, kv_dtype: torch.dtype,
                 device: str, seed: int = 0) -> None:
        gen = torch.Generator(device=device).manual_seed(seed)
        self.batch, self.ctx, self.kv_heads, self.q_heads, self.dim = batch, ctx, kv_heads, q_heads, dim
        self.kv_dtype = kv_dtype
        self.scale = 1 / math.sqrt(dim)
        self.q = torch.randn(batch, q_heads, dim, generator=gen, device=device, dtype=torch.bfloat16)
        # head_seq_dim storage [B, H, L, D] is also SDPA's contiguous input
        hsd_k, hsd_v = (torch.randn(batch, kv_heads, ctx, dim, generator=gen, device=device, dtype=kv_dtype)
                        for _ in range(2))
        self.sdpa_kv = (hsd_k, hsd_v)
        shd_k, shd_v = (t.transpose(1, 2).contiguous() for t in (hsd_k, hsd_v))   # [B, L, H, D]
        n_blocks = batch * ctx // PAGE
        perm = torch.randperm(n_blocks, generator=gen, device=device)
        table = perm.view(batch, ctx // PAGE).to(torch.int32).contiguous()
        pages = []
        for t in (shd_k, shd_v):
            p = torch.empty((n_blocks, PAGE, kv_heads, dim), dtype=kv_dtype, device=device)
            p[perm] = t.view(n_blocks, PAGE, kv_heads, dim)
            pages.append(p)
        hnd = [p.transpose(1, 2).contiguous().transpose(1, 2) for p in pages]        # [blocks, H, PAGE, D] storage
        self.views = {
            "seq_head_dim": StridedKV(shd_k, shd_v),
            "head_seq_dim": StridedKV(hsd_k.transpose(1, 2), hsd_v.transpose(1, 2)),
            "paged": PagedKV(pages[0], pages[1], table, PAGE),
            "paged_hnd": PagedKV(hnd[0], hnd[1], table, PAGE),
        }
        chunks = [SeqChunk(stream=b, start=ctx - 1, tokens=[0]) for b in range(batch)]   # kv_len = ctx
        self.meta = Batch.build(chunks, device=device).attn
        self.kv_bytes = 2 * batch * ctx * kv_heads * dim * kv_dtype.itemsize
        self.want = self.sdpa()

    def sdpa(self) -> torch.Tensor:
        k, v = self.sdpa_kv
        q = self.q.to(k.dtype).unsqueeze(2)                                   # [B, Hq, 1, D]
        return F.scaled_dot_product_attention(q, k, v, scale=self.scale, enable_gqa=self.q_heads != self.kv_heads)

    def ours(self, attn, paged, view: str) -> torch.Tensor:
        mod = paged if view.startswith("paged") else attn
        return mod.triton(self.q, self.views[view], self.meta, self.scale)

    def error(self, out: torch.Tensor) -> float:
        return float((out.float() - self.want.squeeze(2).float()).abs().max())


def fmt_row(cells: list, widths: list[int]) -> str:
    return "  ".join(str(c).rjust(w) for c, w in zip(cells, widths))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dry-run", action="store_true", help="tiny shapes on the CPU (run under TRITON_INTERPRET=1)")
    ap.add_argument("--out", type=Path, default=None, help="folder for attention_bench.txt/.json")
    ap.add_argument("--tune", action="store_true", help="also time kernel settings on three shapes")
    ap.add_argument("--budget-s", type=float, default=170.0, help="stop starting new cases after this many seconds")
    ap.add_argument("--rep-ms", type=int, default=40, help="do_bench repetition time per measurement")
    ap.add_argument("--only", default="", help="comma-separated geometry names (default: all)")
    args = ap.parse_args(argv)
    t_start = time.time()
    dry = args.dry_run
    if not dry and not torch.cuda.is_available():
        print("no CUDA device: run with --dry-run (and TRITON_INTERPRET=1) on a CPU", file=sys.stderr)
        return 2
    if dry and os.environ.get("TRITON_INTERPRET") != "1":
        print("--dry-run runs the Triton kernels in the interpreter: set TRITON_INTERPRET=1", file=sys.stderr)
        return 2
    device = "cpu" if dry else "cuda"
    lines: list[str] = []

    def say(text: str = "") -> None:
        print(text, flush=True)
        lines.append(text)

    import triton

    attn, paged = load_kernels()
    if dry:
        for m in (attn, paged):
            for k, v in DRY_CONSTANTS.items():
                setattr(m, k, v)
    timer = Timer(dry, args.rep_ms)
    if not dry:
        props = torch.cuda.get_device_properties(0)
        say(f"device: {props.name}, {props.multi_processor_count} SMs, torch {torch.__version__}, "
            f"triton {triton.__version__}")
    copy_gbs = copy_bandwidth(timer, device)
    say(f"device-to-device copy: {copy_gbs:.0f} GB/s (read + write)")
    geometries = DRY_GEOMETRIES if dry else GEOMETRIES
    if args.only:
        geometries = {k: v for k, v in geometries.items() if k in args.only.split(",")}
    head = ["geometry", "BxL", "kv", "view", "splits", "us", "graph us", "GB/s", "%copy", "SDPA us",
            "SDPA graph", "x SDPA", "shd/hsd", "max err"]
    widths = [8, 9, 4, 12, 6, 8, 8, 6, 5, 8, 10, 6, 7, 8]
    say(fmt_row(head, widths))
    rows, skipped = [], []
    for gname, (kv_heads, q_heads, dim, shapes) in geometries.items():
        for batch, ctx in shapes:
            for kv_dtype in (torch.bfloat16, torch.float16):
                if time.time() - t_start > args.budget_s:
                    skipped.append(f"{gname} {batch}x{ctx} {KV_NAMES[kv_dtype]}")
                    continue
                case = Case(kv_heads, q_heads, dim, batch, ctx, kv_dtype, device)
                sdpa_us, sdpa_graph = timer.eager(case.sdpa), timer.graph(case.sdpa)
                times = {}
                for view in VIEWS:
                    fn = lambda view=view: case.ours(attn, paged, view)  # noqa: E731
                    err = case.error(fn())
                    us, graph_us = timer.eager(fn), timer.graph(fn)
                    times[view] = us
                    mod = paged if view.startswith("paged") else attn
                    splits = mod.decode_splits(batch, kv_heads, ctx, torch.device(device))
                    row = {"geometry": gname, "batch": batch, "ctx": ctx, "kv": KV_NAMES[kv_dtype], "view": view,
                           "splits": splits, "us": us, "graph_us": graph_us, "gbs": case.kv_bytes / us / 1e3,
                           "copy_frac": case.kv_bytes / us / 1e3 / copy_gbs, "sdpa_us": sdpa_us,
                           "sdpa_graph_us": sdpa_graph, "vs_sdpa": us / sdpa_us, "max_err": err,
                           "sdpa_gbs": case.kv_bytes / sdpa_us / 1e3}
                    if view == "head_seq_dim":
                        row["shd_over_hsd"] = times["seq_head_dim"] / us
                    rows.append(row)
                    say(fmt_row([gname, f"{batch}x{ctx}", row["kv"], view, splits, f"{us:.1f}", f"{graph_us:.1f}",
                                 f"{row['gbs']:.0f}", f"{100 * row['copy_frac']:.0f}", f"{sdpa_us:.1f}",
                                 f"{sdpa_graph:.1f}", f"{row['vs_sdpa']:.2f}",
                                 f"{row['shd_over_hsd']:.2f}" if "shd_over_hsd" in row else "",
                                 f"{err:.1e}"], widths))
                del case
                if not dry:
                    torch.cuda.empty_cache()
    tune_rows = tune(attn, paged, timer, device, dry, t_start, args.budget_s, say) if args.tune else []
    say()
    say("summary (bf16 q; best of the strided views; targets from issue 34: b>=8 & L>=2048: <=1.15x SDPA and "
        ">=70% of copy bandwidth; b=1: <=2x SDPA)")
    sum_widths = [8, 9, 4, 8, 8, 6, 5, 7, 8, 8, 6]
    say(fmt_row(["geometry", "BxL", "kv", "best us", "SDPA us", "x SDPA", "%copy", "shd/hsd", "paged us", "max err",
                 "target"], sum_widths))
    for key in dict.fromkeys((r["geometry"], r["batch"], r["ctx"], r["kv"]) for r in rows):
        group = {r["view"]: r for r in rows if (r["geometry"], r["batch"], r["ctx"], r["kv"]) == key}
        best = min((group[v] for v in ("seq_head_dim", "head_seq_dim") if v in group), key=lambda r: r["us"])
        batch, ctx = key[1], key[2]
        if batch >= 8 and ctx >= 2048:
            ok = best["vs_sdpa"] <= 1.15 and best["copy_frac"] >= 0.70
        elif batch == 1:
            ok = best["vs_sdpa"] <= 2.0
        else:
            ok = None
        err = max(r["max_err"] for r in group.values())
        say(fmt_row([key[0], f"{batch}x{ctx}", key[3], f"{best['us']:.1f}", f"{best['sdpa_us']:.1f}",
                     f"{best['vs_sdpa']:.2f}", f"{100 * best['copy_frac']:.0f}",
                     f"{group['head_seq_dim']['shd_over_hsd']:.2f}" if "head_seq_dim" in group else "",
                     f"{group['paged']['us']:.1f}" if "paged" in group else "", f"{err:.1e}",
                     "-" if ok is None else ("PASS" if ok else "MISS")], sum_widths))
    if skipped:
        say(f"skipped (time budget {args.budget_s:.0f} s): {', '.join(skipped)}")
    say(f"copy bandwidth {copy_gbs:.0f} GB/s; wall {time.time() - t_start:.0f} s")
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "attention_bench.txt").write_text("\n".join(lines) + "\n")
        (args.out / "attention_bench.json").write_text(json.dumps(
            {"copy_gbs": copy_gbs, "rows": rows, "tune": tune_rows, "skipped": skipped,
             "device": "cpu (dry run)" if dry else torch.cuda.get_device_name(0),
             "torch": torch.__version__, "triton": triton.__version__}, indent=1))
    bad = [r for r in rows if not r["max_err"] < 2e-2]
    if bad:
        say(f"WRONG OUTPUTS: {len(bad)} rows with max err >= 2e-2 (or NaN) against SDPA")
    return 1 if bad else 0


def tune(attn, paged, timer: Timer, device: str, dry: bool, t_start: float, budget: float, say) -> list[dict]:
    """Each TUNE setting on TUNE_SHAPES (bf16 cache; seq_head_dim, head_seq_dim and paged views)."""
    say()
    say("tuning (module constants of both kernel files; bf16 KV; us per call, do_bench)")
    head = ["setting", "shape", "seq_head_dim", "head_seq_dim", "paged", "max err"]
    widths = [20, 18, 12, 12, 8, 8]
    say(fmt_row(head, widths))
    out = []
    shapes = [(g, 2, 96) for g in ("SmolLM2",)] if dry else TUNE_SHAPES
    geos = DRY_GEOMETRIES if dry else GEOMETRIES
    for gname, batch, ctx in shapes:
        kv_heads, q_heads, dim, _ = geos[gname]
        case = Case(kv_heads, q_heads, dim, batch, ctx, torch.bfloat16, device)
        for label, consts in (TUNE[:3] if dry else TUNE):
            if time.time() - t_start > budget:
                say(f"(tuning stopped: time budget {budget:.0f} s)")
                return out
            saved = {m: {k: getattr(m, k) for k in consts} for m in (attn, paged)}
            for m in (attn, paged):
                for k, v in consts.items():
                    setattr(m, k, v)
            try:
                res = {}
                err = 0.0
                for view in ("seq_head_dim", "head_seq_dim", "paged"):
                    fn = lambda view=view: case.ours(attn, paged, view)  # noqa: E731
                    err = max(err, case.error(fn()))
                    res[view] = timer.eager(fn)
                out.append({"setting": label, "geometry": gname, "batch": batch, "ctx": ctx, **res, "max_err": err})
                cells = [label, f"{gname} {batch}x{ctx}", *(f"{res[v]:.1f}" for v in res), f"{err:.1e}"]
                say(fmt_row(cells, widths))
            except Exception as e:  # noqa: BLE001 - a setting that does not compile is a finding
                say(f"{label}: {type(e).__name__}: {str(e)[:200]}")
            finally:
                for m, values in saved.items():
                    for k, v in values.items():
                        setattr(m, k, v)
        del case
        if not dry:
            torch.cuda.empty_cache()
    return out


if __name__ == "__main__":
    sys.exit(main())
