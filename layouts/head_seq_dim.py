"""head_seq_dim: per-stream KV with heads before cells, `[layer, stream, kv_head, cell, head_dim]`.

One KV head's keys of a stream are `n_cells * head_dim` contiguous values: a decode kernel that
walks one (stream, KV head) pair streams through contiguous memory, which is the order the seed
report measured as 2x faster than `seq_head_dim` for attention. The price is that one token's row
(all heads) is scattered, so `write` does a strided scatter.

`view(layer)` hands out the permuted logical `[stream, cell, kv_head, head_dim]` view
(non-contiguous); kernels must use its strides.
"""

from __future__ import annotations

import torch

from slotserver.runtime.kv_rows import dst_native, write_rows
from slotserver.runtime.kv_spec import KVSpec, StridedKV

NAME = "head_seq_dim"


class HeadSeqDim:
    """K/V storage of shape `[n_layers, n_streams, n_kv_heads, n_cells, head_dim]` each."""

    name = NAME

    def __init__(self, spec: KVSpec) -> None:
        self.spec = spec
        shape = (spec.n_layers, spec.n_streams, spec.n_kv_heads, spec.n_cells, spec.head_dim)
        self.k_store = spec.zeros(shape)
        self.v_store = spec.zeros(shape)
        self.k = self.k_store.transpose(2, 3)  # logical [layer, stream, cell, kv_head, head_dim]
        self.v = self.v_store.transpose(2, 3)
        self._views = [StridedKV(self.k[i], self.v[i]) for i in range(spec.n_layers)]   # made once, not per step
        self._native = dst_native(self.k[0], self.v[0])

    def write(self, layer: int, streams: torch.Tensor, positions: torch.Tensor,
              k: torch.Tensor, v: torch.Tensor) -> None:
        """Store rows: `k[t]`, `v[t]` (`[tokens, kv_heads, head_dim]`) at (streams[t], positions[t])."""
        view = self._views[layer]
        write_rows(view.k, view.v, streams, positions, k, v, self._native)

    def view(self, layer: int) -> StridedKV:
        return self._views[layer]  # [streams, cells, kv_heads, head_dim], strided

    def copy_stream(self, src: int, dst: int, n: int) -> None:
        """Copy the first `n` cells of stream `src` onto stream `dst` (all layers, all heads)."""
        assert 0 <= n <= self.spec.n_cells and src != dst
        self.k_store[:, dst, :, :n] = self.k_store[:, src, :, :n]
        self.v_store[:, dst, :, :n] = self.v_store[:, src, :, :n]

    def export_stream(self, stream: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Canonical copy of the first `n` cells: K, V each `[n_layers, n, kv_heads, head_dim]`.

        A fresh tensor, never `.contiguous()`: that returns the view itself when it is already
        contiguous (always for n=0), and a saved view writes the whole cache (every slot's K/V)."""
        assert 0 <= n <= self.spec.n_cells
        fresh = torch.contiguous_format
        return self.k[:, stream, :n].clone(memory_format=fresh), self.v[:, stream, :n].clone(memory_format=fresh)

    def import_stream(self, stream: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """Inverse of `export_stream`: write canonical K/V into the first cells of `stream`."""
        n = k.shape[1]
        assert k.shape == v.shape == (self.spec.n_layers, n, self.spec.n_kv_heads, self.spec.head_dim)
        assert n <= self.spec.n_cells
        self.k[:, stream, :n] = k.to(self.spec.dtype)
        self.v[:, stream, :n] = v.to(self.spec.dtype)

    def bytes_used(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.k_store, self.v_store))


def create(spec: KVSpec) -> HeadSeqDim:
    return HeadSeqDim(spec)
