"""A linear layer's bias added in C (slotserver/model/bias_add.py) gives torch's floats exactly."""

from __future__ import annotations

import pytest
import torch

from slotserver.model import bias_add


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_bias_is_added_to_every_row_as_torch_adds_it(dtype):
    gen = torch.Generator().manual_seed(0)
    full = torch.randn(5, 48, generator=gen).to(dtype)
    y = full[:, 8:40]                                   # a column slice: rows 48 apart
    bias = torch.randn(32, generator=gen)               # float32, as a layer keeps it
    expected, untouched = y.clone().add_(bias.to(dtype)), full[:, :8].clone()   # bf16: the bias rounded first
    out = bias_add.add_bias(y, bias)
    assert out.data_ptr() == y.data_ptr() and torch.equal(y, expected)
    assert torch.equal(full[:, :8], untouched)          # the columns beside it are left alone

