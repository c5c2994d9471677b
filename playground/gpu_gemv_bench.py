"""The fused GEMV (kernels/gemv.py) against what the lean body runs today, per layer matmul group, on
a card: does one launch of gemv beat cuBLAS plus the separate norm / rope / gate kernels?

Groups (a decode layer; model/gemv_step.py's launches against model/lean_step.py's):
    qkv      rms_norm(x += y) -> bf16, F.linear(h, Wqkv, b), rope(q|k)   vs  gemv(x; norm, bias, rope)
    wo       F.linear(a, Wo)                                             vs  gemv(a; x += y)
    gate_up  rms_norm(x += y) -> bf16, F.linear(h, Wgu), silu_mul        vs  gemv(x; norm, silu * up)
    down     F.linear(g, Wd)                                             vs  gemv(g; x += y)
    layer    the four summed
Shapes: Qwen2.5-0.5B and Llama-3.1-8B, M = 1, 4, 8, 16 rows, bf16 weights. Times: do_bench_cudagraph
over `copies` distinct weight sets in turn (together > 2x the 50 MB L2, as a step's 24 layers are),
per call; GB/s: the weight bytes over that time, beside the copy bandwidth measured in the same run.
"err": the fused output against the unfused one, max |d| / (1 + |ref|) (bf16: a few ulps).

    PYTHONPATH=. python playground/gpu_gemv_bench.py --out DIR --budget-s 90 [--tune 60]
    PYTHONPATH=. python playground/gpu_gemv_bench.py --dry-run        # CPU, tiny, interpreted: the script only

--tune S: then up to S seconds sweeping GemvPlan (BLOCK_N, BLOCK_K, warps, stages) per group at 1 and
8 rows of both shapes; the best per case is printed beside `plan`'s, to be written into gemv.plan.
"""

from __future__ import annotations

import argparse
import itertools
import json
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

from gpu_attention_bench import Timer, copy_bandwidth  # noqa: E402
from slotserver.runtime.kernel_set import KERNEL_CONTRACT  # noqa: E402
from slotserver.runtime.loader import default_dir, load_by_path  # noqa: E402

SHAPES = {"Qwen0.5B": dict(d=896, heads=14, kv=2, hd=64, ff=4864),
          "Llama8B": dict(d=4096, heads=32, kv=8, hd=128, ff=14336)}
DRY_SHAPES = {"tiny": dict(d=64, heads=4, kv=2, hd=16, ff=96)}
ROWS, DRY_ROWS = (1, 4, 8, 16), (1, 5)
GROUPS = ("qkv", "wo", "gate_up", "down")
L2_BYTES = 50 << 20


def mods() -> dict:
    return {op: load_by_path(default_dir("kernels") / f"{op}.py", KERNEL_CONTRACT).module
            for op in ("gemv", "rms_norm", "rope", "silu_mul")}


def make_layer(s: dict, m: int, dev: str, dry: bool, gen: torch.Generator) -> dict:
    """Weights (several sets: L2 must not hold them), activations and rope rows of one layer."""
    d, q, kv, ff = s["d"], s["heads"] * s["hd"], s["kv"] * s["hd"], s["ff"]
    rnd = lambda *shape: (torch.randn(*shape, generator=gen) * 0.02).to(dev)   # noqa: E731
    per_set = 2 * ((q + 2 * kv) * d + q * d + 2 * ff * d + ff * d)
    copies = 1 if dry else max(1, -(-2 * L2_BYTES // per_set))
    sets = [{"qkv": rnd(q + 2 * kv, d).bfloat16(), "b": rnd(q + 2 * kv).bfloat16(), "wo": rnd(d, q).bfloat16(),
             "gate_up": rnd(2 * ff, d).bfloat16(), "down": rnd(d, ff).bfloat16()} for _ in range(copies)]
    theta = torch.rand(m, s["hd"] // 2, generator=gen).to(dev) * 100
    return {"sets": sets, "x": torch.randn(m, d, generator=gen).to(dev), "y": rnd(m, d).bfloat16() * 50,
            "a": rnd(m, q).bfloat16() * 50, "g": rnd(m, ff).bfloat16() * 50, "norm": 1 + rnd(d),
            "cos": theta.cos(), "sin": theta.sin(), "s": s, "bytes": per_set,
            "qk_heads": s["heads"] + s["kv"]}


def fused(k: dict, L: dict, group: str, w: dict, x: torch.Tensor, tiling=None) -> torch.Tensor:
    """The gemv launch of `group` on weight set w; wo / down add into x (the residual)."""
    s, gemv = L["s"], k["gemv"].triton
    if group == "qkv":
        return gemv(x, w["qkv"], w["b"], "", L["norm"], 1e-6, None, L["cos"], L["sin"], s["hd"],
                    L["qk_heads"] * s["hd"], tiling=tiling)
    if group == "gate_up":
        return gemv(x, w["gate_up"], None, "silu", L["norm"], 1e-6, tiling=tiling)
    return gemv(L["a"] if group == "wo" else L["g"], w[group], None, "", None, 1e-6, x, tiling=tiling)


def unfused(k: dict, L: dict, group: str, w: dict, x: torch.Tensor) -> torch.Tensor:
    """What the lean body launches for `group`: the residual add rides in the norm (x += y there),
    wo / down return their output (the next norm adds it)."""
    s, m = L["s"], x.shape[0]
    if group in ("wo", "down"):
        return F.linear(L["a"] if group == "wo" else L["g"], w[group])
    h = k["rms_norm"].triton(x, L["norm"], 1e-6, add=L["y"], out_dtype=torch.bfloat16)   # x += y; norm
    if group == "gate_up":
        return k["silu_mul"].triton(F.linear(h, w["gate_up"]))
    qkv = F.linear(h, w["qkv"], w["b"])
    qk = k["rope"].triton(qkv[:, : L["qk_heads"] * s["hd"]].view(m, L["qk_heads"], s["hd"]), L["cos"], L["sin"])
    return torch.cat([qk.flatten(1), qkv[:, L["qk_heads"] * s["hd"]:]], dim=1)   # (the check only)


def check(k: dict, L: dict, group: str) -> float:
    """Fused against unfused on weight set 0: max |d| / (1 + |ref|) of the output (wo / down: of x after)."""
    w, x = L["sets"][0], L["x"]
    if group in ("wo", "down"):
        got = fused(k, L, group, w, x.clone())
        want = x + unfused(k, L, group, w, x).float()
    else:
        want = unfused(k, L, group, w, x.clone())
        got = fused(k, L, group, w, x + L["y"].float())
    return float(((got.float() - want.float()).abs() / (1 + want.float().abs())).max())


def per_call_us(timer: Timer, L: dict, call) -> float:
    """One call's graph time: `call(w)` over every weight set in turn, divided by their number."""
    sets = L["sets"]
    return timer.graph(lambda: [call(w) for w in sets]) / len(sets) if not timer.dry else timer.eager(
        lambda: call(sets[0]))


def bench_case(k: dict, timer: Timer, name: str, m: int, dev: str, gen, copy_gbs: float) -> list[dict]:
    s = (DRY_SHAPES if timer.dry else SHAPES)[name]
    L, rows = make_layer(s, m, dev, timer.dry, gen), []
    for group in GROUPS:
        x_f, x_u = L["x"].clone(), L["x"].clone()
        us_f = per_call_us(timer, L, lambda w: fused(k, L, group, w, x_f))
        us_u = per_call_us(timer, L, lambda w: unfused(k, L, group, w, x_u))
        wbytes = L["sets"][0][group].numel() * 2
        rows.append({"shape": name, "m": m, "group": group, "fused_us": us_f, "unfused_us": us_u,
                     "speedup": us_u / us_f, "fused_gbs": wbytes / us_f / 1e3, "copy_gbs": copy_gbs,
                     "err": check(k, L, group)})
    total = {key: sum(r[key] for r in rows) for key in ("fused_us", "unfused_us")}
    rows.append({"shape": name, "m": m, "group": "layer", **total, "speedup": total["unfused_us"] / total["fused_us"],
                 "fused_gbs": L["bytes"] / total["fused_us"] / 1e3, "copy_gbs": copy_gbs,
                 "err": max(r["err"] for r in rows)})
    return rows


def candidates(k: dict, m: int) -> list:
    """GemvPlans to sweep at m rows: the broadcast product (every m: at 5-16 rows it may still beat a
    tl.dot whose 16-column tiles leave Qwen's 896-wide wo / down 56 programs), and tl.dot above
    BROADCAST_MAX_M rows."""
    P, bm = k["gemv"].GemvPlan, 1 << (m - 1).bit_length()
    fma = [P(bm, bn, bk, False, wp) for bn, bk, wp in itertools.product((2, 4, 8, 16, 32), (256, 512, 1024, 2048),
                                                                        (4, 8)) if bm * bn * bk <= 16384]
    if m <= k["gemv"].BROADCAST_MAX_M:
        return fma
    return [P(16, bn, bk, True, 4, st) for bn, bk, st in itertools.product((16, 32, 64), (64, 128, 256), (2, 3, 4))] + fma


def tune(k: dict, timer: Timer, dev: str, gen, budget_s: float) -> list[dict]:
    """The fastest GemvPlan per (shape, group, m in 1 and 8) against plan's, within budget_s."""
    t0, best = time.monotonic(), []
    for name, m, group in itertools.product(SHAPES if not timer.dry else DRY_SHAPES, (1, 8), GROUPS):
        if time.monotonic() - t0 > budget_s:
            print(f"tune: budget of {budget_s:.0f} s spent at {name} {group} m={m}", flush=True)
            break
        L = make_layer((DRY_SHAPES if timer.dry else SHAPES)[name], m, dev, timer.dry, gen)
        x = L["x"].clone()
        base = per_call_us(timer, L, lambda w: fused(k, L, group, w, x))
        found = (base, "plan")
        for p in candidates(k, m)[: 2 if timer.dry else None]:   # the dry run: the path, not the sweep
            if time.monotonic() - t0 > budget_s:
                break
            try:
                us = per_call_us(timer, L, lambda w, p=p: fused(k, L, group, w, x, tiling=p))
            except Exception as e:  # noqa: BLE001 - a plan that does not compile costs a row
                print(f"  {name} {group} m={m} {p}: {type(e).__name__}", flush=True)
                continue
            found = min(found, (us, repr(p)), key=lambda t: t[0])
        best.append({"shape": name, "group": group, "m": m, "plan_us": base, "best_us": found[0], "best": found[1]})
        print(f"tune {name:9} {group:8} m={m:2}: plan {base:7.1f} us, best {found[0]:7.1f} us {found[1]}", flush=True)
    return best


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dry-run", action="store_true", help="CPU, tiny shapes, Triton interpreted: the script only")
    p.add_argument("--budget-s", type=float, default=90.0, help="stop starting new cases after this many seconds")
    p.add_argument("--rep-ms", type=int, default=20)
    p.add_argument("--tune", type=float, default=0.0, help="seconds for the GemvPlan sweep after the table (0: none)")
    p.add_argument("--out", type=Path)
    a = p.parse_args(argv)
    if a.dry_run and os.environ.get("TRITON_INTERPRET") != "1":   # triton fixes interpret-or-compile at import
        os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, "TRITON_INTERPRET": "1"})
    dev = "cpu" if a.dry_run else "cuda"
    timer, k, gen, t0 = Timer(a.dry_run, a.rep_ms), mods(), torch.Generator().manual_seed(0), time.monotonic()
    copy_gbs, rows = copy_bandwidth(timer, dev), []
    for name, m in itertools.product(DRY_SHAPES if a.dry_run else SHAPES, DRY_ROWS if a.dry_run else ROWS):
        if time.monotonic() - t0 > a.budget_s:
            print(f"budget of {a.budget_s:.0f} s spent: {name} m={m} and later cases skipped", flush=True)
            break
        for r in bench_case(k, timer, name, m, dev, gen, copy_gbs):
            rows.append(r)
            print(f"{r['shape']:9} m={r['m']:2} {r['group']:8} fused {r['fused_us']:8.1f} us  unfused "
                  f"{r['unfused_us']:8.1f} us  x{r['speedup']:5.2f}  {r['fused_gbs']:6.0f} GB/s "
                  f"(copy {copy_gbs:.0f})  err {r['err']:.1e}", flush=True)
    tuned = tune(k, timer, dev, gen, a.tune) if a.tune > 0 else []
    if a.out:
        a.out.mkdir(parents=True, exist_ok=True)
        (a.out / "gpu_gemv_bench.json").write_text(json.dumps({"copy_gbs": copy_gbs, "rows": rows, "tune": tuned},
                                                              indent=1))
    return 0 if all(r["err"] < 0.05 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
