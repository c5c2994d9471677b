"""slotserver/model/sigmoid_gate.py: Qwen3.5's attention gate in one C call gives torch's product
(y * sigmoid(g), the sigmoid rounded to y's dtype first) on strided gate rows, float32 and bf16,
for a decode step's few rows and a prompt's many (threads from 64 rows)."""

from __future__ import annotations

import pytest
import torch

from slotserver.model import sigmoid_gate as sg


@pytest.mark.parametrize("rows", [1, 3, 200])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_gate_in_c_is_torchs_product(rows, dtype):
    if sg._LIB is None:
        pytest.skip("no C compiler (or SLOTSERVER_NATIVE=0): torch's product serves")
    gen = torch.Generator().manual_seed(rows)
    y = torch.randn(rows, 96, generator=gen).to(dtype)
    g = (4 * torch.randn(rows, 160, generator=gen)).to(dtype)[:, 40:136]   # a slice of wider rows
    want = y * torch.sigmoid(g.float()).to(dtype)
    got = sg.sigmoid_gate(y.clone(), g)
    ulp = 2e-6 if dtype == torch.float32 else 8e-3        # float32: the polynomial exp; bf16: one rounding
    assert torch.allclose(got.float(), want.float(), rtol=ulp, atol=1e-7)
    assert not torch.equal(got, y)                          # the gate did something
