"""slotserver/model/relu_sqr.py: Nemotron-H's MLP activation (max(y, 0)^2, in place) in one C call
gives torch's `torch.relu(y).square()` bit for bit, float32 and bf16, on strided rows, for a decode
step's few rows and a prompt's many (threads from 64 rows); and torch's form serves what C does not."""

from __future__ import annotations

import pytest
import torch

from slotserver.model import relu_sqr as rs


@pytest.mark.parametrize("rows", [1, 3, 200])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_squared_relu_in_c_is_torchs_bit_for_bit(rows, dtype):
    if rs._LIB is None:
        pytest.skip("no C compiler (or SLOTSERVER_NATIVE=0): torch's form serves")
    gen = torch.Generator().manual_seed(rows)
    wide = (3 * torch.randn(rows, 160, generator=gen)).to(dtype)
    before = wide.clone()
    y = wide[:, 40:136]                                     # rows of a wider buffer (row stride 160)
    want = torch.relu(y).square()
    got = rs.relu_sqr(y)
    assert got.data_ptr() == y.data_ptr()                   # in place
    assert torch.equal(got, want)
    assert torch.equal(wide[:, :40], before[:, :40]) and torch.equal(wide[:, 136:], before[:, 136:])


def test_what_c_does_not_take_is_torchs():
    y = torch.tensor([[-1.5, 0.0, 2.0]], dtype=torch.float64)
    assert rs.relu_sqr(y).tolist() == [[0.0, 0.0, 4.0]]
