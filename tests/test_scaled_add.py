"""slotserver/model/scaled_add.py: granite's residual multiplier (x += s * y) and logit scale
(x *= s) in C give torch's floats bit for bit (the product rounded before the add: no FMA), on
float32 and bf16 branch outputs, strided rows, a decode step's few rows and a prompt's many. That a
granite decode step is then C calls only and replays from a step graph: tests/test_hybrid.py
(granitehybrid_dense, granitehybrid)."""

from __future__ import annotations

import pytest
import torch

from slotserver.model import scaled_add as sa


def _native() -> None:
    if sa._LIB is None:
        pytest.skip("no C compiler (or SLOTSERVER_NATIVE=0): torch's ops serve")


@pytest.mark.parametrize("rows", [1, 3, 100])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_scaled_add_is_torchs_bit_for_bit(rows, dtype):
    _native()
    gen = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, 80, generator=gen)
    y = torch.randn(rows, 120, generator=gen).to(dtype)[:, 20:100]          # strided rows
    want = x + y * 0.246
    got = sa.scaled_add(x.clone(), y, 0.246)
    assert torch.equal(got, want)
    logits = torch.randn(rows, 300, generator=gen)
    assert torch.equal(sa.scale_rows(logits.clone(), 1 / 3.0), logits * (1 / 3.0))
