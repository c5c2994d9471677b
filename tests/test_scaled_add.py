"""slotserver/model/scaled_add.py: granite's residual multiplier (x += s * y) and logit scale
(x *= s) in C give torch's floats bit for bit (the product rounded before the add: no FMA), on
float32 and bf16 branch outputs, strided rows, a decode step's few rows and a prompt's many; and a
granite decode step is C calls only, so it replays from a step graph."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from slotserver.model import scaled_add as sa
from slotserver.model.bundle import ModelBundle
from slotserver.model.config import ModelConfig
from slotserver.model.generate import GenRequest, generate
from test_moe import q8_copy

ARCHS = Path(__file__).parent / "fixtures" / "archs"


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


def test_a_granite_hybrid_decode_step_replays_from_a_step_graph_with_the_eager_tokens(tmp_path):
    """granitehybrid (dense FFN) on Q8_0 blocks: with the multipliers in C its decode steps are
    captured, and the replayed steps give the eager steps' tokens."""
    _native()
    bundle = ModelBundle.load(ModelConfig(model_path=q8_copy(ARCHS / "granitehybrid_dense.gguf", tmp_path / "q8.gguf"),
                                          dtype="auto"))
    reqs = [GenRequest([5 + i, 17, 200, 33, 1, 90], 8, ignore_eos=True) for i in range(3)]
    replayed = [r.tokens for r in generate(bundle.model, reqs, frozenset())]
    assert bundle.model.graphs.graphs, "no decode step was captured"
    bundle.model.set_step_graphs(False)
    assert [r.tokens for r in generate(bundle.model, reqs, frozenset())] == replayed
