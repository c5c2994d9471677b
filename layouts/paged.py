"""paged: vLLM-style KV pages, a pool `[layer, n_blocks, block_size, kv_head, head_dim]` + block table.

A stream's cells live in fixed-size blocks handed out from a shared pool as the stream grows
(`write` allocates; the pool tensor grows by doubling and shrinks when mostly free), so memory
follows the tokens actually held rather than `n_cells` per stream (a logical maximum here),
and the defrag move (`copy_stream`) is a block-table edit with refcounted sharing and
copy-on-write, not a data copy. `free_stream(stream)` returns a finished stream's blocks.

The bookkeeping (allocator, table, copy-on-write) is `slotserver/runtime/paged_blocks.py`; this file
chooses the storage order: tokens before heads inside a block ("NHD", vLLM's default), so one
cell's K of all heads is one contiguous row. `layouts/paged_hnd.py` is the heads-first variant.

The pool may grow to `n_streams * ceil(n_cells / block_size)` blocks (every stream full), or to
`KVSpec.pool_cells` when set; then the scheduler admits requests by free blocks (`KVBudget`).
"""

from __future__ import annotations

import torch

from slotserver.runtime.kv_spec import KVSpec
from slotserver.runtime.paged_cache import PagedKVCache

NAME = "paged"
BLOCK_SIZE = 16


class Paged(PagedKVCache):
    """Pages stored `[n_layers, n_blocks, block_size, kv_heads, head_dim]`, contiguous."""

    name = NAME

    def make_pages(self, shape: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
        store = self.spec.zeros(shape)
        return store, store  # the storage is already in logical order


def create(spec: KVSpec, block_size: int = BLOCK_SIZE) -> Paged:
    return Paged(spec, block_size)
