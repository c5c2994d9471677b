"""`Linear`: the dense bf16 weight gives F.linear's exact results (with and without bias, any row
count; pre-blocked for oneDNN where this CPU runs bf16 natively, plain elsewhere), the AMX int4
kernel (kernels/q4_matmul.py) matches the dequantized weight, and the row thresholds route each
call to the intended kernel. `QLinear`: its parts go through the KernelSet's qmatmul, outputs
concatenated, bias added. Results are asserted on every CPU; which copy is kept only where the path
exists here."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from slotserver.runtime.kernel_set import KERNEL_CONTRACT, KernelSet
from slotserver.runtime.loader import default_dir, load_by_path
from slotserver.model.linear import INT4_GROUP, Linear, QLinear, prepack_available
from slotserver.runtime.qblocks import T, dequantize, random_qweight

q4_matmul = load_by_path(default_dir("kernels") / "q4_matmul.py", KERNEL_CONTRACT).module


@pytest.mark.parametrize("bias", [False, True], ids=["no-bias", "bias"])
def test_prepacked_dense_equals_f_linear_exactly(bias):
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(96, 64, generator=gen).bfloat16()
    b = torch.randn(96, generator=gen).bfloat16() if bias else None
    lin = Linear.build(w, b, "dense", 0)
    assert lin.out_features == 96
    # exactly one copy: the pre-packed one where oneDNN runs bf16 natively (AVX-512), else the weight
    assert (lin.packed is not None, lin.dense is not None) == (prepack_available(), not prepack_available())
    for rows in (1, 3, 17, 64):
        x = torch.randn(rows, 64, generator=gen).bfloat16()
        assert torch.equal(lin(x), F.linear(x, w, b))
        col = x.t().contiguous().t()  # a column-major input too (torch's own bf16 GEMM on AVX2 rounds it differently)
        assert torch.equal(lin(col), F.linear(col, w, b))


def test_forced_avx2_keeps_the_plain_weight_with_the_same_results(monkeypatch):
    """SLOTSERVER_CPU=avx2 takes the path of an AVX2-only host (no oneDNN bf16 re-blocking):
    same outputs as F.linear."""
    monkeypatch.setenv("SLOTSERVER_CPU", "avx2")
    gen = torch.Generator().manual_seed(3)
    w, b = torch.randn(48, 64, generator=gen).bfloat16(), torch.randn(48, generator=gen).bfloat16()
    lin = Linear.build(w, b, "dense", 0)
    assert not prepack_available() and lin.packed is None and torch.equal(lin.dense, w)
    x = torch.randn(5, 64, generator=gen).bfloat16()
    assert torch.equal(lin(x), F.linear(x, w, b))


def test_auto4_uses_int4_up_to_the_threshold_then_the_dense_gemm():
    gen = torch.Generator().manual_seed(1)
    w = torch.randn(64, 4 * INT4_GROUP, generator=gen).bfloat16()
    lin = Linear.build(w, None, "auto4", 8)
    assert lin.q4 is not None and (lin.packed is not None or lin.dense is not None)
    for rows, want_int4 in ((1, True), (8, True), (9, False), (32, False)):
        x = torch.randn(rows, w.shape[1], generator=gen).bfloat16()
        int4 = torch._weight_int4pack_mm_for_cpu(x, lin.q4, INT4_GROUP, lin.q4_scale_zero)
        assert torch.equal(lin(x), int4 if want_int4 else F.linear(x, w)), rows


needs_amx = pytest.mark.skipif(not q4_matmul.available(), reason="no AMX int4 kernel here (needs amx_tile + amx_bf16, "
                               "SLOTSERVER_CPU auto|amx, a compiler and the OS's tile permission)")


def _q4_weight(gen, n: int, k: int):
    q = torch.randint(0, 16, (n, k), generator=gen)
    d = torch.rand(n, k // INT4_GROUP, generator=gen) * 0.05 + 0.01
    lo = -torch.rand(n, k // INT4_GROUP, generator=gen) * 0.4
    w = (lo[..., None] + d[..., None] * q.view(n, k // INT4_GROUP, INT4_GROUP).float()).view(n, k)
    return q, d, lo, w


@needs_amx
@pytest.mark.parametrize("rows", [1, 2, 3, 8, 15, 16, 17, 32, 40])
def test_amx_int4_matmul_matches_the_dequantized_weight(rows):
    """Any row count (16 per pass), several column blocks and groups: the float32 result of the
    dequantized weight, up to the bf16 rounding of the output."""
    gen = torch.Generator().manual_seed(rows)
    q, d, lo, w = _q4_weight(gen, 80, 6 * INT4_GROUP)
    x = torch.randn(rows, w.shape[1], generator=gen).bfloat16()
    want = x.float() @ w.t()
    got = q4_matmul.cpu(x, *q4_matmul.pack(q, d, lo)).float()
    assert got.shape == want.shape
    assert (got - want).abs().max() <= 8e-3 * want.abs().max(), rows


@needs_amx
def test_auto4_routes_rows_to_torch_int4_the_amx_kernel_and_dense(monkeypatch):
    gen = torch.Generator().manual_seed(2)
    w = torch.randn(64, 4 * INT4_GROUP, generator=gen).bfloat16()
    b = torch.randn(64, generator=gen).bfloat16()
    lin = Linear.build(w, b, "auto4", 8, native_max_rows=32, q4_kernel=q4_matmul)
    assert lin.q4 is not None and lin.q4n is not None and (lin.packed is not None or lin.dense is not None)
    calls = []

    class Ops:   # the KernelSet's q4_matmul, counting calls
        @staticmethod
        def q4_matmul(x, *a):
            calls.append(x.shape[0])
            return q4_matmul.cpu(x, *a)

    for rows, want in ((1, "int4"), (2, "int4"), (3, "amx"), (8, "amx"), (32, "amx"), (33, "dense")):
        x = torch.randn(rows, w.shape[1], generator=gen).bfloat16()
        y = lin(x, Ops)
        if want == "int4":
            assert torch.equal(y, torch._weight_int4pack_mm_for_cpu(x, lin.q4, INT4_GROUP, lin.q4_scale_zero) + b)
        elif want == "dense":
            assert torch.equal(y, F.linear(x, w, b))
        else:  # the same 4-bit weight as torch's kernel (whose scales are bf16, the AMX kernel's float32)
            int4 = (torch._weight_int4pack_mm_for_cpu(x, lin.q4, INT4_GROUP, lin.q4_scale_zero) + b).float()
            assert calls[-1] == rows and (y.float() - int4).abs().max() <= 0.02 * int4.abs().max()
    assert calls == [3, 8, 32]


def test_q4_matmul_kernel_reference_unpacks_what_pack_packed():
    """The kernel's reference (any CPU) computes with exactly the weight `pack` was given."""
    gen = torch.Generator().manual_seed(4)
    q, d, lo, w = _q4_weight(gen, 32, 3 * INT4_GROUP)
    x = torch.randn(5, w.shape[1], generator=gen)
    w4, dz = q4_matmul.pack(q, d, lo)
    torch.testing.assert_close(q4_matmul.unpack(w4, dz), w, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(q4_matmul.reference(x, w4, dz), x @ w.t(), rtol=1e-5, atol=1e-5)
    if not q4_matmul.available():   # the AMX-less hosts and variants serve the reference
        assert torch.equal(q4_matmul.cpu(x, w4, dz), q4_matmul.reference(x, w4, dz))


@pytest.mark.parametrize("bias", [False, True], ids=["no-bias", "bias"])
def test_qlinear_concatenates_its_parts_through_the_kernel_set(bias):
    """Two formats (as a Q4_K_M file's q/k and v): one qmatmul per part, outputs side by side in
    order, the bias added once; equal to the dequantized weight's float32 product within qmatmul's TOL."""
    gen = torch.Generator().manual_seed(5)
    parts = [random_qweight(gen, T.Q4_K, 48, 256), random_qweight(gen, T.Q6_K, 16, 256)]
    b = torch.randn(64, generator=gen) if bias else None
    ops = KernelSet.load()
    lin = QLinear(parts, b)
    x = torch.randn(3, 256, generator=gen)
    y = lin(x, ops)
    assert y.shape == (3, 64) and lin.out_features == 64 and ops.timings["qmatmul"][0] == 2
    want = x @ torch.cat([dequantize(p) for p in parts]).t() + (0 if b is None else b)
    assert (y - want).abs().max() <= 3e-2 * (1 + want.abs().max())
    second = ops.qmatmul(x, parts[1])
    assert torch.equal(y[:, 48:], second if b is None else second + b[48:])


@pytest.mark.parametrize("rows", [1, 4])
@pytest.mark.parametrize("bias", [False, True], ids=["no-bias", "bias"])
def test_qlinear_fused_equals_the_separate_kernels(bias, rows):
    """`QLinear.fused` (what the forward calls with GGUF blocks): the pre-norm and the residual add
    inside qmatmul, parts of mixed formats (a Q4_K_M file's Q5_0 q|k beside a small Q8_0 v) written
    into their columns: the same floats as rms_norm, one qmatmul per part, concatenation, bias and
    add called apart."""
    gen = torch.Generator().manual_seed(rows)
    parts = [random_qweight(gen, T.Q5_0, 64, 256), random_qweight(gen, T.Q8_0, 32, 256)]
    b = torch.randn(96, generator=gen) if bias else None
    ops = KernelSet.load()
    lin = QLinear(parts, b)
    x, norm = torch.randn(rows, 256, generator=gen), 1 + 0.1 * torch.randn(256, generator=gen)
    residual = torch.randn(rows, 96, generator=gen)
    for _ in range(2):   # the second call runs on the repacked forms built by the first
        want = residual + lin(ops.rms_norm(x, norm, 1e-5), ops)
        acc = residual.clone()
        got = lin.fused(x, ops, norm, 1e-5, False, acc)
        assert got is acc
        if ops.modules["qmatmul"].module._LIB is None:   # torch's formulas: close, not the C's floats
            assert (got - want).abs().max() <= 3e-2 * (1 + want.abs().max())
        else:
            assert torch.equal(got, want)
