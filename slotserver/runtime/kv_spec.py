"""The shape of a KV cache, and the view a strided layout hands to attention kernels.

Every layout module in `layouts/` is created from a `KVSpec` and must keep the layout contract
(see `docs/architecture.md`): write rows, view for attention, copy a stream, export/import a stream
in the canonical form `[n_layers, n, n_kv_heads, head_dim]`, report bytes used.
"""

from __future__ import annotations

import mmap
import math
from dataclasses import dataclass
from typing import NamedTuple

import torch


@dataclass(frozen=True)
class KVSpec:
    """Geometry of the KV memory: `n_streams` independent sequences of `n_cells` positions each.

    `pool_cells` caps a paged layout's block pool (all streams together; None: every stream
    full). With paged layouts `n_cells` is each stream's logical maximum and memory follows the
    cells held; flat layouts allocate `n_streams * n_cells` at once and ignore `pool_cells`.
    """

    n_layers: int
    n_streams: int
    n_cells: int
    n_kv_heads: int
    head_dim: int
    dtype: torch.dtype = torch.float32
    device: str = "cpu"
    pool_cells: int | None = None

    def __post_init__(self) -> None:
        for name in ("n_layers", "n_streams", "n_cells", "n_kv_heads", "head_dim"):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"KVSpec.{name} must be a positive int, got {value!r}")
        if self.pool_cells is not None and (not isinstance(self.pool_cells, int) or self.pool_cells <= 0):
            raise ValueError(f"KVSpec.pool_cells must be a positive int or None, got {self.pool_cells!r}")

    def zeros(self, shape: tuple[int, ...], dtype: torch.dtype | None = None) -> torch.Tensor:
        """Zeroed KV memory (`dtype` default: the spec's) on the spec's device. On the CPU, from
        1 MiB, an anonymous private mapping: the kernel hands out zero pages, and a page becomes
        resident only once a cell on it is written, so a flat layout's memory follows the tokens
        held (as a paged pool does) where `torch.zeros` writes every page of the whole `-c` at
        start (a 0.5B model at -c 4096: 50 MiB resident before any request). Private, so that a
        forked lab validator writing to it could never reach the server's cache."""
        dtype = dtype or self.dtype
        nbytes = math.prod(shape) * dtype.itemsize
        if torch.device(self.device).type != "cpu" or nbytes < 1 << 20:
            return torch.zeros(shape, dtype=dtype, device=self.device)
        buf = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        return torch.frombuffer(buf, dtype=dtype).view(shape)   # the tensor keeps `buf` mapped

    @property
    def bytes_per_cell(self) -> int:
        """Bytes of K plus V for one position of one stream across all layers (unquantized)."""
        elem = torch.empty((), dtype=self.dtype).element_size()
        return 2 * self.n_layers * self.n_kv_heads * self.head_dim * elem


class StridedKV(NamedTuple):
    """K and V of one layer as logical `[stream, cell, kv_head, head_dim]` tensors.

    They may be non-contiguous views (e.g. `head_seq_dim` stores `[stream, head, cell, dim]` and
    hands out a permuted view); kernels must use the strides, never assume contiguity. Quantized
    layouts (q8) hand out int8 `k`/`v` plus per-(stream, cell, head) scales: value = q * scale.
    """

    k: torch.Tensor  # [n_streams, n_cells, n_kv_heads, head_dim]
    v: torch.Tensor  # [n_streams, n_cells, n_kv_heads, head_dim]
    k_scale: torch.Tensor | None = None  # [n_streams, n_cells, n_kv_heads] (int8 layouts only)
    v_scale: torch.Tensor | None = None

    paged = False


class PagedKV(NamedTuple):
    """K and V of one layer as pages plus a block table (vLLM style).

    Cell `c` of stream `s` lives in page `block_table[s, c // block_size]` at row `c % block_size`.
    `k_pages`/`v_pages` are logical `[n_blocks, block_size, kv_head, head_dim]` views (any strides,
    e.g. `paged_hnd` stores heads before tokens inside a block).
    """

    k_pages: torch.Tensor      # [n_blocks, block_size, n_kv_heads, head_dim]
    v_pages: torch.Tensor      # [n_blocks, block_size, n_kv_heads, head_dim]
    block_table: torch.Tensor  # [n_streams, max_blocks_per_stream] int32/int64, -1 = unmapped
    block_size: int

    paged = True
