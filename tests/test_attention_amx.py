"""Prompt rows over long histories (kernels/attention_amx.c and attention_amx_kv.c on CPUs with AMX;
the row kernel elsewhere): many 64-cell blocks, several tiles per chunk, a chunk's K/V prepared once
and read by all its tiles. Each prompt row must match the float32 reference within the kernel's
TOL, and compute the same floats however its prompt was chunked or batched, flat or paged."""

from __future__ import annotations

import math

import pytest
import torch

from slotserver.runtime.batch import Batch, SeqChunk
from slotserver.runtime.kernel_set import KERNEL_CONTRACT
from slotserver.runtime.kv_spec import PagedKV, StridedKV
from slotserver.runtime.loader import default_dir, load_by_path

KV_HEADS, GROUP, CELLS = 2, 3, 400   # 3 query vectors a row: a 256-vector AMX tile holds 85 rows


def _kernel(op: str):
    mod = load_by_path(default_dir("kernels") / f"{op}.py", KERNEL_CONTRACT).module
    if mod._LIB is None:
        pytest.skip("no C compiler here (or SLOTSERVER_NATIVE=0)")
    return mod


def _data(dim: int, cache: torch.dtype, seed: int = 0):
    """q for every position of stream 0 and K/V of two streams (stream 1: a second chunk in the batch)."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(CELLS, KV_HEADS * GROUP, dim, generator=gen)
    k, v = (torch.randn(2, CELLS, KV_HEADS, dim, generator=gen).to(cache) for _ in range(2))
    return q, k, v


def _rows(mod, q, kv, chunks: list[tuple[int, int]], window: int = 0, other: bool = False) -> torch.Tensor:
    """Stream 0's rows start..end-1 of each chunk (one call each) as prompt rows, stacked; `other`:
    each call also carries a 70-row prompt chunk of stream 1 in front."""
    out = []
    for start, end in chunks:
        parts = [SeqChunk(stream=1, start=200, tokens=[0] * 70, prompt=True)] if other else []
        parts.append(SeqChunk(stream=0, start=start, tokens=[0] * (end - start), prompt=True))
        meta = Batch.build(parts).attn.with_layer(window, 0.0)
        qs = torch.cat([q[200:270], q[start:end]]) if other else q[start:end]
        out.append(mod.cpu(qs, kv, meta, 1 / math.sqrt(q.shape[2]))[70 if other else 0:])
    return torch.cat(out)


@pytest.mark.parametrize("dim,cache,window", [(64, torch.float16, 0), (64, torch.bfloat16, 0),
                                              (128, torch.float16, 150)])
def test_long_prompt_rows_match_the_reference(dim, cache, window):
    """A 250-row chunk after 150 cached cells (3 tiles, up to 7 blocks a row), against the reference."""
    mod = _kernel("attention")
    q, k, v = _data(dim, cache)
    kv = StridedKV(k, v)
    got = _rows(mod, q, kv, [(150, 400)], window)
    meta = Batch.build([SeqChunk(stream=0, start=150, tokens=[0] * 250)]).attn.with_layer(window, 0.0)
    want = mod.reference(q[150:400], kv, meta, 1 / math.sqrt(dim))
    torch.testing.assert_close(got, want, atol=mod.TOL[torch.float32], rtol=mod.TOL[torch.float32])


@pytest.mark.parametrize("window", [0, 100])
def test_prompt_rows_do_not_depend_on_chunking_batching_or_layout(window):
    """Rows 100..399 computed as one chunk, as chunks of 37/163/100 rows, beside another stream's
    chunk, and on shuffled 16-cell pages: the same floats every time."""
    flat, paged = _kernel("attention"), _kernel("paged_attention")
    q, k, v = _data(64, torch.float16, seed=1)
    kv = StridedKV(k, v)
    whole = _rows(flat, q, kv, [(100, 400)], window)
    assert torch.equal(_rows(flat, q, kv, [(100, 137), (137, 300), (300, 400)], window), whole)
    assert torch.equal(_rows(flat, q, kv, [(100, 400)], window, other=True), whole)
    order = torch.randperm(2 * CELLS // 16, generator=torch.Generator().manual_seed(2))
    pages = [torch.empty(2 * CELLS // 16, 16, KV_HEADS, 64, dtype=torch.float16) for _ in range(2)]
    for p, t in zip(pages, (k, v)):
        p[order] = t.reshape(2 * CELLS // 16, 16, KV_HEADS, 64)
    table = order.view(2, CELLS // 16).int()
    assert torch.equal(_rows(paged, q, PagedKV(pages[0], pages[1], table, 16), [(100, 250), (250, 400)], window), whole)
