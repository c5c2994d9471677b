"""Every kernel module: contract present, and its CPU implementation matches its torch reference
on random shapes (odd sizes included) in float32 and bfloat16, within the module's own tolerance."""

from __future__ import annotations

import pytest
import torch

from slotserver.kv_spec import StridedKV
from slotserver.kernel_set import KERNEL_CONTRACT, OPS, KernelSet
from slotserver.module_loader import default_dir, load_by_path

KERNEL_FILES = sorted(p for p in default_dir("kernels").glob("*.py") if not p.stem.startswith("_"))


def test_every_op_the_model_needs_has_a_kernel_file():
    assert {p.stem for p in KERNEL_FILES} >= set(OPS)
    assert set(KernelSet.load().versions()) >= set(OPS)


@pytest.mark.parametrize("path", KERNEL_FILES, ids=lambda p: p.stem)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_cpu_matches_reference(path, dtype):
    mod = load_by_path(path, KERNEL_CONTRACT).module
    assert mod.OP == path.stem
    gen = torch.Generator().manual_seed(1234)
    for _ in range(25):
        inputs = mod.example_inputs(gen, dtype)
        got, want = mod.cpu(*inputs), mod.reference(*inputs)
        assert got.shape == want.shape and got.dtype == want.dtype
        tol = mod.TOL[dtype]
        torch.testing.assert_close(got.float(), want.float(), atol=tol, rtol=tol)


def test_attention_reads_only_each_sequences_own_cells():
    """Stale values past a sequence's length (huge, they would dominate if not masked) and NaN
    past the longest sequence (never to be read) must not change the output."""
    mod = load_by_path(default_dir("kernels") / "attention.py", KERNEL_CONTRACT).module
    gen = torch.Generator().manual_seed(7)
    for _ in range(10):
        q, kv, meta, scale = mod.example_inputs(gen, torch.float32)
        k, v = kv.k, kv.v
        want = mod.reference(q, kv, meta, scale)
        k2, v2 = torch.full_like(k, 1e4), torch.full_like(v, 1e4)
        k2[:, meta.max_kv:], v2[:, meta.max_kv:] = float("nan"), float("nan")
        for b in range(meta.n_seqs):
            s, n = int(meta.seq_streams[b]), int(meta.kv_lens[b])
            k2[s, :n], v2[s, :n] = k[s, :n], v[s, :n]
        got = mod.cpu(q, StridedKV(k2, v2), meta, scale)
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
