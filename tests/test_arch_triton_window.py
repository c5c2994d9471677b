"""The Triton attention kernels under a sliding window (gemma2/3) and soft-capping (gemma2), run by
triton's interpreter on CPU tensors: each sequence's cells before its window hold NaN, and the
output still equals the reference on the clean cache (the kernels start their KV loops at the first
cell a sequence's, or a row tile's, earliest query sees). The interpreter needs its own process
(see test_triton_kernels.py).
"""

from __future__ import annotations

import json
import math

import pytest
import torch

from slotserver.lab.check import triton_mode
from slotserver.runtime.kernel_set import KERNEL_CONTRACT
from slotserver.runtime.kv_spec import PagedKV, StridedKV
from slotserver.runtime.loader import default_dir, load_by_path
from triton_script import run_interpreted

MARK = "TRITON-WINDOW "


def _worst(op: str, softcap: bool) -> float:
    """Max |triton(cells before each window = NaN) - reference(clean)| over a few random batches."""
    mod = load_by_path(default_dir("kernels") / f"{op}.py", KERNEL_CONTRACT).module
    gen, worst = torch.Generator().manual_seed(31 + softcap), 0.0
    for _ in range(5):
        q, kv, meta, scale = mod.example_inputs(gen, torch.float32)
        meta = meta.with_layer(int(torch.randint(1, 12, (), generator=gen)), 1.5 if softcap else 0.0)
        want = mod.reference(q, kv, meta, scale)
        firsts = [max(0, n - m - meta.window + 1) for n, m in zip(meta.kv_lens.tolist(), meta.q_lens.tolist())]
        if kv.paged:
            k, v = kv.k_pages.clone(), kv.v_pages.clone()
            for s, first in zip(meta.seq_streams.tolist(), firsts):
                for c in range(first):
                    k[int(kv.block_table[s, c // kv.block_size]), c % kv.block_size] = float("nan")
                    v[int(kv.block_table[s, c // kv.block_size]), c % kv.block_size] = float("nan")
            poisoned = PagedKV(k, v, kv.block_table, kv.block_size)
        else:
            k, v = (t.float() * (1 if sc is None else sc.unsqueeze(-1)) for t, sc in ((kv.k, kv.k_scale), (kv.v, kv.v_scale)))
            for s, first in zip(meta.seq_streams.tolist(), firsts):
                k[s, :first], v[s, :first] = float("nan"), float("nan")
            poisoned = StridedKV(k, v)
        err = float((mod.triton(q, poisoned, meta, scale) - want).abs().max())
        worst = max(worst, float("inf") if math.isnan(err) else err)   # NaN: a poisoned cell was read
    return worst


def _checks() -> dict:
    return {f"{op}/{cap}": _worst(op, cap) for op in ("attention", "paged_attention") for cap in (False, True)}


@pytest.fixture(scope="module")
def interpreted() -> dict:
    if triton_mode() == "interpret":
        return _checks()
    return run_interpreted(__file__, MARK, timeout=600)


@pytest.mark.parametrize("softcap", [False, True], ids=["window", "window+softcap"])
@pytest.mark.parametrize("op", ["attention", "paged_attention"])
def test_triton_attention_starts_at_each_window(interpreted, op, softcap):
    worst = interpreted[f"{op}/{softcap}"]
    assert worst < 1e-4, f"{op}: max error {worst}"


if __name__ == "__main__":
    print(MARK + json.dumps(_checks()))
