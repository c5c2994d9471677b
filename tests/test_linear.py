"""`Linear`: the dense bf16 weight pre-blocked for oneDNN gives F.linear's exact results (with
and without bias, any row count), and the row thresholds route each call to the intended kernel."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from slotserver.linear import INT4_GROUP, Linear

pytestmark = pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="torch built without oneDNN")


@pytest.mark.parametrize("bias", [False, True], ids=["no-bias", "bias"])
def test_prepacked_dense_equals_f_linear_exactly(bias):
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(96, 64, generator=gen).bfloat16()
    b = torch.randn(96, generator=gen).bfloat16() if bias else None
    lin = Linear.build(w, b, "dense", 0)
    assert lin.packed is not None and lin.dense is None and lin.out_features == 96
    for rows in (1, 3, 17, 64):
        x = torch.randn(rows, 64, generator=gen).bfloat16()
        assert torch.equal(lin(x), F.linear(x, w, b))
        assert torch.equal(lin(x.t().contiguous().t()), F.linear(x, w, b))  # a column-major input too


def test_auto4_uses_int4_up_to_the_threshold_then_the_dense_gemm():
    gen = torch.Generator().manual_seed(1)
    w = torch.randn(64, 4 * INT4_GROUP, generator=gen).bfloat16()
    lin = Linear.build(w, None, "auto4", 8)
    assert lin.q4 is not None and lin.packed is not None
    for rows, want_int4 in ((1, True), (8, True), (9, False), (32, False)):
        x = torch.randn(rows, w.shape[1], generator=gen).bfloat16()
        int4 = torch._weight_int4pack_mm_for_cpu(x, lin.q4, INT4_GROUP, lin.q4_scale_zero)
        assert torch.equal(lin(x), int4 if want_int4 else F.linear(x, w)), rows
