"""paged_hnd: KV pages with heads before tokens inside a block, `[layer, n_blocks, kv_head, block_size, head_dim]`.

Same growing pool, block table, copy-on-write defrag and `free_stream` as `layouts/paged.py` (the shared
bookkeeping is `slotserver/runtime/paged_blocks.py`); only the order of rows inside a block differs. With
heads first, one head's keys of a block are `block_size * head_dim` contiguous values, which is
what a kernel that walks one KV head at a time reads (FlashInfer's "HND" layout).

`view(layer).k_pages` is the permuted logical `[n_blocks, block_size, kv_head, head_dim]` view of
that storage (non-contiguous): kernels must use its strides.
"""

from __future__ import annotations

import torch

from slotserver.runtime.kv_spec import KVSpec
from slotserver.runtime.paged_cache import PagedKVCache

NAME = "paged_hnd"
BLOCK_SIZE = 16


class PagedHND(PagedKVCache):
    """Pages stored `[n_layers, n_blocks, kv_heads, block_size, head_dim]`."""

    name = NAME

    def make_pages(self, shape: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
        layers, blocks, block_size, heads, dim = shape
        store = self.spec.zeros((layers, blocks, heads, block_size, dim))
        return store, store.transpose(2, 3)  # logical [layers, blocks, block_size, heads, dim]


def create(spec: KVSpec, block_size: int = BLOCK_SIZE) -> PagedHND:
    return PagedHND(spec, block_size)
