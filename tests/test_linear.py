"""`Linear`: the dense bf16 weight gives F.linear's exact results (with and without bias, any row
count; pre-blocked for oneDNN where this CPU runs bf16 natively, plain elsewhere), the AMX int4
kernel matches the dequantized weight, and the row thresholds route each call to the intended
kernel. Results are asserted on every CPU; which copy is kept only where the path exists here."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from slotserver.model import q4_matmul
from slotserver.model.linear import INT4_GROUP, Linear, prepack_available


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
    got = q4_matmul.matmul(x, *q4_matmul.pack(q, d, lo)).float()
    assert got.shape == want.shape
    assert (got - want).abs().max() <= 8e-3 * want.abs().max(), rows


@needs_amx
def test_auto4_routes_rows_to_torch_int4_the_amx_kernel_and_dense(monkeypatch):
    gen = torch.Generator().manual_seed(2)
    w = torch.randn(64, 4 * INT4_GROUP, generator=gen).bfloat16()
    b = torch.randn(64, generator=gen).bfloat16()
    lin = Linear.build(w, b, "auto4", 8, native_max_rows=32)
    assert lin.q4 is not None and lin.q4n is not None and (lin.packed is not None or lin.dense is not None)
    calls = []
    amx = q4_matmul.matmul
    monkeypatch.setattr(q4_matmul, "matmul", lambda *a: calls.append(a[0].shape[0]) or amx(*a))
    for rows, want in ((1, "int4"), (2, "int4"), (3, "amx"), (8, "amx"), (32, "amx"), (33, "dense")):
        x = torch.randn(rows, w.shape[1], generator=gen).bfloat16()
        y = lin(x)
        if want == "int4":
            assert torch.equal(y, torch._weight_int4pack_mm_for_cpu(x, lin.q4, INT4_GROUP, lin.q4_scale_zero) + b)
        elif want == "dense":
            assert torch.equal(y, F.linear(x, w, b))
        else:  # the same 4-bit weight as torch's kernel (whose scales are bf16, the AMX kernel's float32)
            int4 = (torch._weight_int4pack_mm_for_cpu(x, lin.q4, INT4_GROUP, lin.q4_scale_zero) + b).float()
            assert calls[-1] == rows and (y.float() - int4).abs().max() <= 0.02 * int4.abs().max()
    assert calls == [3, 8, 32]
