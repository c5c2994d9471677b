"""The attention kernels' C row kernel on deepseek2's latent attention: one KV head of 576 values
(rotated key 64 + latent 512) shared by 16-128 query heads, flat and paged, every cache type.

Why apart from the generic kernel test: those example inputs also feed the Triton kernels (and `lab
check` on a card), which do not take such rows; here only the CPU path runs. What a user sees: a
DeepSeek/GLM-4.7-Flash model's attention computed by the C kernel (not the torch fallback), equal to
the reference, and a row's floats independent of the batch around it.
"""

from __future__ import annotations

import math

import pytest
import torch

from slotserver.runtime.batch import Batch, SeqChunk
from slotserver.runtime.kernel_set import KERNEL_CONTRACT
from slotserver.runtime.kv_spec import PagedKV, StridedKV
from slotserver.runtime.loader import default_dir, load_by_path

ROW = 576


def _kernel(op: str):
    return load_by_path(default_dir("kernels") / f"{op}.py", KERNEL_CONTRACT).module


def _batch(gen: torch.Generator, n_streams: int = 4):
    """Decode rows and prompt chunks on shuffled streams (starting past 0: earlier cells cached)."""
    chunks = [SeqChunk(stream=s, start=int(torch.randint(0, 40, (), generator=gen)),
                       tokens=[0] * (1 if s % 2 else int(torch.randint(2, 9, (), generator=gen))), prompt=s % 2 == 0)
              for s in torch.randperm(n_streams, generator=gen).tolist()]
    return chunks


def _inputs(heads: int, cache: torch.dtype, gen: torch.Generator):
    chunks = _batch(gen)
    meta = Batch.build(chunks).attn
    q = torch.randn(sum(len(c.tokens) for c in chunks), heads, ROW, generator=gen)
    k = torch.randn(4, 56, 1, ROW, generator=gen).to(cache)
    return chunks, meta, q, StridedKV(k, k)   # K = V: the latent row


@pytest.mark.skipif(_kernel("attention")._LIB is None, reason="no C compiler (SLOTSERVER_NATIVE=0)")
@pytest.mark.parametrize("heads", [16, 20, 128])
@pytest.mark.parametrize("cache", [torch.float32, torch.bfloat16, torch.float16])
def test_latent_rows_run_in_c_and_equal_the_reference(heads, cache):
    mod, gen = _kernel("attention"), torch.Generator().manual_seed(heads)
    _, meta, q, kv = _inputs(heads, cache, gen)
    wide = mod._native.spread(heads, kv)
    assert mod._native_ok(q, wide, meta), "the C kernel must serve a 576-wide, one-KV-head cache"
    scale = 1 / math.sqrt(192)
    torch.testing.assert_close(mod.cpu(q, kv, meta, scale), mod.reference(q, kv, meta, scale), atol=2e-5, rtol=2e-5)


@pytest.mark.skipif(_kernel("attention")._LIB is None, reason="no C compiler (SLOTSERVER_NATIVE=0)")
def test_a_latent_row_is_the_same_alone_or_in_a_batch():
    """A decode row's output bit for bit whatever else the step holds (the C kernel's promise)."""
    mod, gen = _kernel("attention"), torch.Generator().manual_seed(3)
    chunks, meta, q, kv = _inputs(20, torch.bfloat16, gen)
    batch = mod.cpu(q, kv, meta, 0.1)
    row = next(i for i, c in enumerate(chunks) if len(c.tokens) == 1)
    first = sum(len(c.tokens) for c in chunks[:row])
    alone = mod.cpu(q[first: first + 1], kv, Batch.build([chunks[row]]).attn, 0.1)
    assert torch.equal(alone[0], batch[first])


@pytest.mark.skipif(_kernel("paged_attention")._LIB is None, reason="no C compiler (SLOTSERVER_NATIVE=0)")
def test_paged_latent_rows_equal_the_flat_ones():
    paged, flat, gen = _kernel("paged_attention"), _kernel("attention"), torch.Generator().manual_seed(5)
    _, meta, q, kv = _inputs(20, torch.bfloat16, gen)
    pages = kv.k.view(4 * 7, 8, 1, ROW)                                   # 8-cell pages, in stream order
    table = torch.arange(4 * 7, dtype=torch.int32).view(4, 7)
    pkv = PagedKV(pages, pages, table, 8)
    assert paged._native_ok(q, paged._native.spread(20, pkv), meta)
    assert torch.equal(paged.cpu(q, pkv, meta, 0.1), flat.cpu(q, kv, meta, 0.1))


def test_other_caches_pass_through_spread_untouched():
    """Every layer of every step asks: a cache with several KV heads, or few query heads on one,
    comes back as the same object (no per-call rebuild), a wide one on a single head is spread."""
    mod = _kernel("attention")
    k = torch.zeros(2, 8, 3, 64)
    gqa, mqa = StridedKV(k, k), StridedKV(k[:, :, :1], k[:, :, :1])
    assert mod._native.spread(9, gqa) is gqa and mod._native.spread(8, mqa) is mqa
    wide = mod._native.spread(20, StridedKV(torch.zeros(2, 8, 1, ROW), torch.zeros(2, 8, 1, ROW)))
    assert wide.k.shape[2] == 2 and wide.k.stride(2) == 0 and wide.k_scale is None
