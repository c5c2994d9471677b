"""kernels/qmatmul_gpu.py (GGUF blocks multiplied on the GPU) on CPU tensors: every format in both
regimes (decode with K split, dequantized tiles + mm; with and without the residual add) equal to
gguf's dequantizer + a float64 matmul, run by triton's interpreter; the tiling plan; and a tiny
model loaded as `--gpu-weights blocks` giving the dense reference's greedy tokens. The wide GEMV
(QGEMV = "wide": q8_1 activations, dp4a) against a torch q8_1 quantizer and the exact product, on
the interpreter here (tests/test_gpu_qgemv.py: compiled on a card, batch invariance included).

The interpreted half runs in a subprocess (this file as a script with TRITON_INTERPRET=1): triton
fixes interpret-or-compile at its first import (see test_triton_kernels.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from slotserver.runtime.kernel_set import KERNEL_CONTRACT
from slotserver.runtime.loader import default_dir, load_by_path
from slotserver.runtime.qblocks import T, dequantize, random_qweight
from triton_script import usable_cores

ROOT = Path(__file__).resolve().parents[1]

MARK = "QMATMUL-GPU "
PROMPTS = [[5, 17, 200, 33, 1, 90, 41], [7, 8, 9]]
N_PREDICT = 4


def _module():
    return load_by_path(default_dir("kernels") / "qmatmul_gpu.py", KERNEL_CONTRACT).module


def _format_errors() -> dict[str, float]:
    """Per format and case: max |triton - exact| / (1 + max |exact|), in float32: the slices kernel's
    regimes (the wide GEMV and the int8 product, the defaults at 1-16 rows, have wide_errors and
    test_qmma.py: their x is 8-bit)."""
    mod, out = _module(), {}
    mod.QGEMV, mod.QMMA = "slices", "off"   # the slices alone (the int8 product, from 3 rows of Q4_K, 5 of Q6_K: test_qmma.py)
    mod.slices.MIN_SPLIT_BLOCKS = 2   # split K at these small sizes too (the interpreter is slow; the plan is what serves)
    mod.slices.DEQUANT_TILE_VALUES = 16 * 256   # several dequantized tiles per weight (16 rows at K=256, 25 at 160)
    gen = torch.Generator().manual_seed(0)
    for qtype in mod.FORMATS:
        k = 256 if qtype in (T.Q4_K, T.Q5_K, T.Q6_K) else 160   # decode: K split 4 ways / 2 ways (3 + 2 blocks)
        w = random_qweight(gen, qtype, 45, k)
        exact = dequantize(w).double()
        for m in (1, 5, 24):   # the GEMV, the 2-16 row dot, dequantized tiles + torch.mm (from 17 rows)
            x = torch.randn(m, k, generator=gen)
            ref = x.double() @ exact.T
            scale = 1 + float(ref.abs().max())
            out[f"{qtype.name}/{m}"] = float((mod.triton(x, w).double() - ref).abs().max()) / scale
            if m != 5:   # the residual add after the split partials (1), after the mm (24)
                acc = torch.randn(m, w.n, generator=gen)
                y_acc = mod.triton(x, w, acc.clone())
                out[f"{qtype.name}/{m}/acc"] = float((y_acc.double() - ref - acc.double()).abs().max()) / scale
    return out


def q8_1_reference(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] -> (q [M, K/32, 32] integers as float, d [M, K/32, 1]): d = max|x| / 127 per 32,
    q = x * (127 / max|x|) rounded half to even, in float32 (what the wide GEMV's x side must be)."""
    xb = x.float().reshape(x.shape[0], -1, 32)
    amax = xb.abs().amax(-1, keepdim=True)
    inv = torch.where(amax > 0, 127.0 / torch.where(amax > 0, amax, 1.0), 0.0)
    return torch.round(xb * inv), amax / 127.0


# K: one block and several a step (masked tails); every format the wide GEMV serves
WIDE_CASES = {T.Q4_K: (256, 768), T.Q5_K: (256, 768), T.Q6_K: (512, 1536), T.Q8_0: (64, 448), T.Q5_0: (64, 448),
              T.Q4_0: (64, 448), T.Q4_1: (64, 448), T.Q5_1: (64, 448)}


def wide_errors(device: str = "cpu", x_dtype: torch.dtype = torch.float32) -> dict[str, dict]:
    """Per format and K: is it served wide, its q8_1 against the torch quantizer (largest integer
    difference), the product against its quantized x times the exact weights and against the exact
    product (relative), rows 0..2 of 8 bit-equal alone / in 3 / in 8 (batch invariance), the residual add."""
    mod, out = _module(), {}
    mod.QGEMV, mod.QMMA = "wide", "off"   # the wide GEMV alone at 1, 3 and 8 rows (the int8 product serves from 3)
    gen = torch.Generator().manual_seed(3)
    for qtype, ks in WIDE_CASES.items():
        for k in ks:
            w = random_qweight(gen, qtype, 5, k)   # odd N: the last program's rows are masked (3 programs of 2)
            exact = dequantize(w).double()
            w = type(w)(w.raw.to(device), w.qtype, w.k, w.n)
            x = torch.randn(8, k, generator=gen).to(x_dtype)
            q, d = q8_1_reference(x)
            kq, kd, _ = mod.wide._q8_1.q8_1(x.to(device))
            kq, kd = kq.cpu().float().reshape(q.shape), kd.cpu()
            ref = (kq * kd[..., None]).reshape(8, k).double() @ exact.T   # the kernel's own x side (checked below)
            scale = 1 + float(ref.abs().max())
            ys = {m: mod.triton(x[:m].to(device), w).cpu() for m in (1, 3, 8)}
            acc = torch.randn(2, w.n, generator=gen)
            y_acc = mod.triton(x[:2].to(device), w, acc.to(device).clone()).cpu()
            out[f"{qtype.name}/{k}"] = dict(
                served=mod._wide_ok(x[:1].to(device), w),
                q8=int((kq - q).abs().max()), d=float((kd - d[..., 0]).abs().max()),
                err=float((ys[8].double() - ref).abs().max()) / scale,
                exact_err=float((ys[8].double() - x.double() @ exact.T).abs().max()) / scale,
                invariant=bool(torch.equal(ys[1], ys[8][:1]) and torch.equal(ys[3], ys[8][:3])),
                acc_err=float((y_acc.double() - ref[:2] - acc.double()).abs().max()) / scale)
    return out


def _fused_errors(qgemv: str = "slices") -> dict[str, float]:
    """QLinear(op="qmatmul_gpu").fused as the model calls it (the interpreted kernel set): a Q4_K_M
    style q|k|v (Q4_K and Q6_K parts, a bias) after the pre-norm, and a down projection after the
    SiLU gate added into the residual; relative max error against torch in float64. With qgemv
    "wide" the Q4_K part (and down) take the wide GEMV, the 210-byte Q6_K rows the slices: the
    reference quantizes the Q4_K part's x as q8_1 (q8_1_reference)."""
    from slotserver.model.linear import QLinear
    from slotserver.runtime.kernel_set import KernelSet

    ops, gen = KernelSet.load(impl="triton"), torch.Generator().manual_seed(2)
    ops.modules["qmatmul_gpu"].module.QGEMV = qgemv
    ops.modules["qmatmul_gpu"].module.QMMA = "off"   # 3 rows of Q4_K: the int8 product's otherwise (test_qmma.py)
    wide = (lambda v: _q8_1_dequant(v)) if qgemv == "wide" else (lambda v: v)   # noqa: E731
    parts = [random_qweight(gen, T.Q4_K, 40, 256), random_qweight(gen, T.Q6_K, 24, 256)]
    exact = [dequantize(p).double() for p in parts]
    bias, norm, x = torch.randn(64, generator=gen), 1 + 0.1 * torch.randn(256, generator=gen), torch.randn(3, 256, generator=gen)
    normed = x.double() * torch.rsqrt(x.double().pow(2).mean(-1, keepdim=True) + 1e-5) * norm.double()
    qkv = QLinear(parts, bias, op="qmatmul_gpu").fused(x, ops, norm, 1e-5, False, None)
    ref = torch.cat([wide(normed) @ exact[0].T, normed @ exact[1].T], dim=1) + bias.double()
    gate_up, acc = torch.randn(3, 512, generator=gen), torch.randn(3, 40, generator=gen)
    g, u = gate_up.double().chunk(2, dim=-1)
    down = QLinear(parts[:1], op="qmatmul_gpu").fused(gate_up, ops, None, 0.0, True, acc.clone())
    ref_down = acc.double() + wide(g * torch.sigmoid(g) * u) @ exact[0].T
    exact_qkv = torch.cat([normed @ e.T for e in exact], dim=1) + bias.double()   # no q8_1: tells the paths apart
    return {"qkv": float((qkv.double() - ref).abs().max()) / (1 + float(ref.abs().max())),
            "down": float((down.double() - ref_down).abs().max()) / (1 + float(ref_down.abs().max())),
            "qkv_vs_exact": float((qkv.double() - exact_qkv).abs().max()) / (1 + float(exact_qkv.abs().max()))}


def _norm_q8(device: str = "cpu") -> dict:
    """rms_norm's `q8_1` fusion (interpreted): the normed rows unchanged by it, its q8_1 bit-equal to
    quantizing those rows with qmatmul_gpu's own kernel, and within one step of q of the torch form
    the references use (per output dtype; with and without the residual add)."""
    norm = load_by_path(default_dir("kernels") / "rms_norm.py", KERNEL_CONTRACT).module
    q8 = _module().wide._q8_1
    gen, out = torch.Generator().manual_seed(5), {"same_rows": True, "same_q8": True, "torch_q": 0, "torch_d": 0.0,
                                              "q8_of_its_rows": True}
    for out_dtype in (torch.float32, torch.bfloat16):
        for rows, dim, add in ((1, 64, False), (3, 96, True), (2, 1024, True)):
            x, y = torch.randn(rows, dim, generator=gen).to(device), torch.randn(rows, dim, generator=gen).to(device)
            w = (1 + 0.1 * torch.randn(dim, generator=gen)).to(device)
            bufs, torch_bufs, ref_bufs, cpu_bufs = (q8.buffers(rows, dim, device) for _ in range(4))
            xa, xb, xr, xc = x.clone(), x.clone(), x.clone(), x.clone()
            got = norm.triton(xa, w, 1e-5, add=y if add else None, out_dtype=out_dtype, q8_1=bufs)
            plain = norm.triton(xb, w, 1e-5, add=y if add else None, out_dtype=out_dtype)
            ref = norm.reference(xr, w, 1e-5, add=y if add else None, out_dtype=out_dtype, q8_1=ref_bufs)
            q8.torch_q8_1(got, torch_bufs)
            if device == "cpu":
                yc = norm.cpu(xc, w, 1e-5, add=y if add else None, out_dtype=out_dtype, q8_1=cpu_bufs)
                out["q8_of_its_rows"] &= _is_q8_1(yc, cpu_bufs)
            out["same_rows"] &= bool(torch.equal(got, plain) and torch.equal(xa, xb))
            out["same_q8"] &= all(torch.equal(a, b) for a, b in zip(bufs, q8.q8_1(got)))
            out["torch_q"] = max(out["torch_q"], int((bufs[0].int() - torch_bufs[0].int()).abs().max()))
            out["torch_d"] = max(out["torch_d"], float(((bufs[1] - torch_bufs[1]).abs() / (1e-30 + torch_bufs[1])).max()))
            out["q8_of_its_rows"] &= _is_q8_1(ref, ref_bufs) and _is_q8_1(got, bufs)
    gate = load_by_path(default_dir("kernels") / "silu_mul.py", KERNEL_CONTRACT).module
    for dtype, (rows, d_ff) in ((torch.float32, (3, 96)), (torch.bfloat16, (2, 1184)), (torch.float32, (1, 2080))):
        gu = (3 * torch.randn(rows, 2 * d_ff, generator=gen)).to(device, dtype)   # 1184, 2080: a partial last block
        bufs, ref_bufs = q8.buffers(rows, d_ff, device), q8.buffers(rows, d_ff, device)
        got = gate.triton(gu, q8_1=bufs)
        ref = gate.reference(gu, q8_1=ref_bufs)
        out["gate_same_rows"] = out.get("gate_same_rows", True) and bool(torch.equal(got, gate.triton(gu)))
        out["gate_same_q8"] = out.get("gate_same_q8", True) and all(torch.equal(a, b) for a, b in zip(bufs, q8.q8_1(got)))
        out["q8_of_its_rows"] &= _is_q8_1(ref, ref_bufs) and _is_q8_1(got, bufs)
    return out


def _is_q8_1(rows: torch.Tensor, bufs: tuple[torch.Tensor, ...]) -> bool:
    """Whether bufs hold a q8_1 of rows by its definition (not by the code that made them): per 32
    values d = max|x| / 127, integers |q| <= 127 within half a step of x / d, s = d * sum(q)."""
    q, d, s = (t.cpu().double() for t in bufs)
    v = rows.cpu().double().reshape(rows.shape[0], -1, 32)
    q = q.reshape(v.shape)
    amax = v.abs().amax(-1)
    return bool(torch.allclose(d, amax / 127, rtol=1e-6, atol=0) and (q.abs() <= 127).all()
                and ((q * d[..., None] - v).abs() <= d[..., None] * (0.5 + 1e-5)).all()
                and torch.allclose(s, d * q.sum(-1), rtol=1e-6, atol=1e-30))


def _q8_fusion(path: Path) -> dict:
    """One decode step of the tiny model on blocks (wide GEMV) with the norms' q8_1 handed to the
    matmuls (model/lean_step.py) and without (Q8_MAX_ROWS 0): its logits, and how many times
    qmatmul_gpu quantized an x itself."""
    sys.path.insert(0, str(ROOT / "playground"))
    import decode_launches as dl
    from slotserver.model import lean_step
    from slotserver.model.model import LlamaModel
    from slotserver.model.weights import WeightFormat
    from slotserver.runtime.kernel_set import KernelSet

    kernels = KernelSet.load(impl="triton")
    q8 = kernels.modules["qmatmul_gpu"].module.wide._q8_1
    own, quantized = q8.q8_1, []
    q8.q8_1 = lambda x: quantized.append(x.shape[0]) or own(x)   # the wide launch looks it up per call
    model = LlamaModel.load(path, kernels=kernels, fmt=WeightFormat("blocks"))
    model.set_step_graphs(False)
    out, fused_rows, applies = {"layers": model.spec.n_layers}, lean_step.Q8_MAX_ROWS, lean_step.applies
    # one prefill per model, then the step in each form: a step rewrites its own cells before reading
    # them, so each form's step sees the same cache (the interpreter's forwards are this test's time)
    cache, step = dl.decode_batch(model, 2, 7, together=True)
    for name, rows in (("fused", fused_rows), ("unfused", 0), ("body", 0)):
        lean_step.Q8_MAX_ROWS = rows
        if name == "body":   # the layers as the CPU runs them (model.py `_body`): the lean body's floats
            lean_step.applies = lambda *args: False
        quantized[:] = []
        out[name] = {"logits": model.forward(step, cache).tolist(), "quantized": len(quantized),
                     "applies": lean_step.applies(model, model.kernels)}
    lean_step.Q8_MAX_ROWS, lean_step.applies = fused_rows, applies
    bf16 = LlamaModel.load(path, torch.bfloat16, kernels=kernels, fmt=WeightFormat("blocks"))   # what a card serves
    bf16.set_step_graphs(False)
    cache, step = dl.decode_batch(bf16, 2, 7, together=True)
    for name, rows in (("bf16_fused", fused_rows), ("bf16_unfused", 0), ("bf16_body", 0)):
        lean_step.Q8_MAX_ROWS = rows
        if name == "bf16_body":
            lean_step.applies = lambda *args: False
        with dl.LaunchCounter() as counter:   # the launches of the step, as playground/decode_launches.py counts
            out[name] = {"logits": bf16.forward(step, cache).float().tolist(), "launches": len(counter.names)}
    lean_step.Q8_MAX_ROWS, lean_step.applies = fused_rows, applies
    return out


def _q8_1_dequant(x: torch.Tensor) -> torch.Tensor:
    """x [M, K] as the wide GEMV sees it: q8_1_reference's integers times their scales, float64."""
    q, d = q8_1_reference(x.float())
    return (q * d).reshape(x.shape).double()


def _blocks_tokens(path: Path, qgemv: str = "slices") -> list[list[int]]:
    """Greedy tokens of PROMPTS with the weights as `--gpu-weights blocks` loads them (on CPU tensors),
    qmatmul_gpu's QGEMV switch set to `qgemv`."""
    from slotserver.model.generate import GenRequest, generate
    from slotserver.model.model import LlamaModel
    from slotserver.model.weights import WeightFormat
    from slotserver.runtime.kernel_set import KernelSet

    kernels, served = KernelSet.load(impl="triton"), []
    mod = kernels.modules["qmatmul_gpu"].module
    mod.QGEMV, wide = qgemv, mod.wide.launch
    mod.wide.launch = lambda *args: served.append(args[0].shape[0]) or wide(*args)   # triton() looks it up per call
    model = LlamaModel.load(path, kernels=kernels, fmt=WeightFormat("blocks"))
    model.set_step_graphs(False)   # the CPU's C step graphs record C kernels, not interpreted Triton
    kinds = {type(m).__name__ + ":" + getattr(m, "op", "") for m in model.weights.matmuls()}
    assert kinds == {"QLinear:qmatmul_gpu"}, kinds
    assert model.weights.embed.blocks is model.weights.output.parts[0]   # tied: one copy of the bytes, looked up
    tokens = [r.tokens for r in generate(model, [GenRequest(list(p), N_PREDICT, ignore_eos=True) for p in PROMPTS], frozenset())]
    assert bool(served) == (qgemv == "wide") and set(served) <= {1, 2}, served   # decode steps only
    return tokens


@pytest.fixture(scope="module")
def tiny_q8(tmp_path_factory) -> Path:
    from tiny_gguf import write_tiny_gguf

    return write_tiny_gguf(tmp_path_factory.mktemp("tinyq8") / "tiny.gguf", tensor_type=T.Q8_0)


@pytest.fixture(scope="module")
def interpreted(tiny_q8) -> dict:
    """Every interpreted check, in two processes at once where two cores are usable: the interpreter
    is one core's work. Under `make test` a worker is pinned to one core (tests/conftest.py): there
    one process runs both halves (a second would only add its imports)."""
    env = dict(os.environ, TRITON_INTERPRET="1")
    halves = ("a", "b") if usable_cores() >= 2 else ("ab",)
    procs = [subprocess.Popen([sys.executable, __file__, str(tiny_q8), half], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=env) for half in halves]
    out = {}
    for proc in procs:
        stdout, stderr = proc.communicate(timeout=600)
        lines = [ln for ln in stdout.splitlines() if ln.startswith(MARK)]
        assert proc.returncode == 0 and lines, stderr[-3000:]
        out.update(json.loads(lines[-1][len(MARK):]))
    return out


def test_every_format_in_both_regimes_matches_the_exact_product(interpreted):
    errors = interpreted["errors"]
    assert len(errors) == len(_module().FORMATS) * 5   # rows 1, 5, 24 and the residual adds at 1 and 24
    bad = {case: e for case, e in errors.items() if e > 1e-4}   # float32 sums of exact weights
    assert not bad, bad


def test_the_models_fused_calls_match_torch_with_mixed_formats_bias_norm_gate_and_residual(interpreted):
    assert interpreted["fused"]["qkv"] < 1e-4 and interpreted["fused"]["down"] < 1e-4, interpreted["fused"]


def test_the_models_fused_calls_through_the_wide_gemv_match_the_q8_1_product(interpreted):
    """x is the norm kernel's float32 output (and the SiLU gate's), quantized to q8_1 by the wide path
    for the Q4_K part only: the float64 reference quantizing the same part gives the same product;
    against the unquantized product the 8-bit activation shows."""
    fused = interpreted["fused_wide"]
    assert fused["qkv"] < 1e-5 and fused["down"] < 1e-5, fused
    assert fused["qkv_vs_exact"] > 1e-4 and interpreted["fused"]["qkv_vs_exact"] < 1e-5, (fused, interpreted["fused"])


def test_a_tiny_model_on_blocks_generates_the_dense_references_tokens(interpreted, tiny_q8):
    from slotserver.model.generate import GenRequest, generate
    from slotserver.model.model import LlamaModel
    from slotserver.model.weights import WeightFormat

    dense = LlamaModel.load(tiny_q8, fmt=WeightFormat("dense"))   # float32, exact dequantized weights
    ref = [r.tokens for r in generate(dense, [GenRequest(list(p), N_PREDICT, ignore_eos=True) for p in PROMPTS], frozenset())]
    assert interpreted["tokens"] == ref and all(len(t) == N_PREDICT for t in ref)


def test_the_wide_gemv_computes_the_q8_1_product_for_every_format_it_serves(interpreted):
    """Every case served wide; x quantized exactly as the torch q8_1 quantizer does; the product equal to
    that quantized x times the exact weights up to float32 sums; within the module's TOL of the exact
    product (the 8-bit activation is the approximation, as on the CPU); rows independent of M."""
    cases = interpreted["wide"]
    assert set(cases) == {f"{t.name}/{k}" for t, ks in WIDE_CASES.items() for k in ks}
    for name, c in cases.items():
        assert c["served"] and c["q8"] == 0 and c["d"] < 1e-6, (name, c)
        assert c["err"] < 1e-5 and c["acc_err"] < 1e-5, (name, c)
        assert 1e-4 < c["exact_err"] < _module().TOL[torch.float32] / 2, (name, c)   # > 0: really the q8_1 route
        assert c["invariant"], (name, c)


def test_the_wide_gemv_serves_by_default_and_refuses_what_it_cannot_read(monkeypatch):
    mod, gen = _module(), torch.Generator().manual_seed(4)
    assert mod.QGEMV == "wide"
    x = torch.zeros(1, 256)
    mod.QGEMV = "slices"
    assert not mod._wide_ok(x, random_qweight(gen, T.Q4_K, 4, 256))    # switched off
    mod.QGEMV = "wide"
    assert mod._wide_ok(x, random_qweight(gen, T.Q4_K, 4, 256))
    assert not mod._wide_ok(x, random_qweight(gen, T.Q6_K, 4, 256))   # 210-byte rows: not whole words
    assert not mod._wide_ok(x, random_qweight(gen, T.MXFP4, 4, 256))  # no wide kernel (17-byte blocks): the slices
    assert set(WIDE_CASES) == set(mod.wide.WIDE_FORMATS)
    assert not mod._wide_ok(torch.zeros(9, 256), random_qweight(gen, T.Q4_K, 4, 256))   # past WIDE_MAX_M rows
    monkeypatch.setenv("SLOTSERVER_QGEMV", "fast")
    with pytest.raises(ValueError, match="SLOTSERVER_QGEMV='fast'"):
        mod._qgemv_mode()


def test_a_tiny_model_on_blocks_with_the_wide_gemv_generates_the_dense_references_tokens(interpreted, tiny_q8):
    """Decode steps (2 rows) through the wide GEMV, prefill through the slices: the 8-bit activation
    moves no greedy token of this model (the CPU's block product, 8-bit too, flips prompt 0's near-tie)."""
    from slotserver.model.generate import GenRequest, generate
    from slotserver.model.model import LlamaModel
    from slotserver.model.weights import WeightFormat

    dense = LlamaModel.load(tiny_q8, fmt=WeightFormat("dense"))
    ref = [r.tokens for r in generate(dense, [GenRequest(list(p), N_PREDICT, ignore_eos=True) for p in PROMPTS], frozenset())]
    assert interpreted["tokens_wide"] == ref and all(len(t) == N_PREDICT for t in ref)


def test_plan_splits_k_at_decode_and_tiles_large_batches():
    mod = _module()
    bm, bn, split, _ = mod.slices.plan(1, 896, 4864, 132)          # Qwen2.5-0.5B down at b=1: 14 column blocks
    assert (bm, bn) == (1, mod.slices.GEMV_BLOCK_N) and split * 14 >= 4 * 132 // 2 and 4864 // 32 // split >= mod.slices.MIN_SPLIT_BLOCKS
    assert mod.slices.plan(8, 896, 4864, 132)[:2] == (16, mod.slices.DECODE_BLOCK_N)
    assert mod.slices.plan(1, 151936, 896, 132)[2] == 1              # the output matmul fills the card unsplit
    assert mod.slices.plan(64, 4096, 4096, 132)[:3] == (mod.slices.GEMM_BLOCK_M, mod.slices.GEMM_BLOCK_N, 1)
    assert mod.slices.DEQUANT_GEMM_ROWS == mod.slices.SMALL_M + 1   # past decode: dequantized tiles + cuBLAS (H100-measured)


def test_the_wide_plan_keeps_every_sm_busy_and_a_step_within_its_words():
    mod = _module()
    for qtype, words, values in ((T.Q4_K, 32, 256), (T.Q6_K, 64, 256), (T.Q8_0, 8, 32), (T.Q5_0, 4, 32)):
        for n, k in ((6144, 4096), (4096, 14336), (896, 4864 if values == 32 else 4864 // 256 * 256), (151936, 4096)):
            r, step = mod.wide.wide_plan(n, k, qtype, 132)
            assert 2 <= r <= 16 and step >= 1 and r * step * words <= max(mod.wide.WIDE_WORDS, r * words), (qtype, n, k, r, step)
            assert -(-n // r) >= mod.wide.WIDE_PROGRAMS_PER_SM * 132 or r == 2, (qtype, n, r)   # rows halved until the SMs fill
            assert step <= 1 << (k // values - 1).bit_length(), (qtype, k, step)            # no step past the row
    assert mod.wide.wide_plan(4096, 4096, T.Q4_K, 132) == (4, 16)   # Llama-8B wo: 1024 programs, 2048 words a step


def test_the_norms_and_gates_q8_1_is_what_the_matmul_would_quantize(interpreted):
    """rms_norm's and silu_mul's `q8_1` fusion writes, beside the unchanged rows, exactly the q8_1 qmatmul_gpu's own
    quantizer makes of them (one `_quantize32`); the torch form the references use agrees to a
    rounding step of q (a GPU's fused multiply-add may round a tie the other way)."""
    c = interpreted["norm_q8"]
    assert c["same_rows"] and c["same_q8"] and c["torch_q"] <= 1 and c["torch_d"] < 1e-6, c
    assert c["gate_same_rows"] and c["gate_same_q8"] and c["q8_of_its_rows"], c


def test_on_blocks_the_norms_hand_their_q8_1_to_the_matmuls_with_the_same_logits(interpreted):
    """A decode step on GGUF blocks with the fusion: the logits bit-equal to the step without it, and
    x quantized by qmatmul_gpu itself only for wo and the output (3 a layer fewer: qkv and gate|up
    read the norms' q8_1, down the gate's); and the lean body's logits are those of the CPU's body."""
    c = interpreted["q8_fusion"]
    fused, unfused, body = c["fused"], c["unfused"], c["body"]
    assert fused["applies"] and fused["logits"] == unfused["logits"] == body["logits"], c
    assert c["bf16_fused"]["logits"] == c["bf16_unfused"]["logits"], c   # bf16: still the values quantized apart
    # launches of the bf16 step (what a card replays): the old body casts each layer's normed rows in
    # a launch of its own (one more for the step), the lean body does not; the fusion saves 3 a layer
    launches = {k: c[f"bf16_{k}"]["launches"] for k in ("fused", "unfused", "body")}
    assert launches["body"] - launches["unfused"] == c["layers"] + 1, launches
    assert launches["unfused"] - launches["fused"] == 3 * c["layers"], launches
    assert unfused["quantized"] == 4 * c["layers"] + 1 and fused["quantized"] == c["layers"] + 1, c


def test_a_format_without_a_kernel_is_refused_by_name():
    w = random_qweight(torch.Generator().manual_seed(1), T.Q3_K, 4, 256)
    with pytest.raises(AssertionError, match="Q3_K"):
        _module().triton(torch.zeros(1, 256), w)


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).parent))
    model = Path(sys.argv[1])
    out = {}   # two halves of ~30 s each on one core, interpreted (2026-11-27)
    if "a" in sys.argv[2]:
        out.update({"wide": wide_errors(), "fused": _fused_errors(), "tokens": _blocks_tokens(model),
                    "tokens_wide": _blocks_tokens(model, "wide")})
    if "b" in sys.argv[2]:
        out.update({"errors": _format_errors(), "fused_wide": _fused_errors("wide"),
                    "norm_q8": _norm_q8(), "q8_fusion": _q8_fusion(model)})
    print(MARK + json.dumps(out))
