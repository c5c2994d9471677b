"""seq_head_dim: llama.cpp's flat per-stream KV layout, `[layer, stream, cell, kv_head, head_dim]`.

Each stream is one contiguous block of memory, so copying a stream (llama.cpp's `seq_cp`, the
defrag move) is one slice copy per tensor, and export/import are plain slices.
"""

from __future__ import annotations

import torch

from slotserver.runtime.kv_rows import dst_native, write_rows
from slotserver.runtime.kv_spec import KVSpec, StridedKV

NAME = "seq_head_dim"


class SeqHeadDim:
    """K/V storage of shape `[n_layers, n_streams, n_cells, n_kv_heads, head_dim]` each."""

    name = NAME

    def __init__(self, spec: KVSpec) -> None:
        self.spec = spec
        shape = (spec.n_layers, spec.n_streams, spec.n_cells, spec.n_kv_heads, spec.head_dim)
        self.k = spec.zeros(shape)
        self.v = spec.zeros(shape)
        self._views = [StridedKV(self.k[i], self.v[i]) for i in range(spec.n_layers)]   # made once, not per step
        self._native = dst_native(self.k[0], self.v[0])

    def write(self, layer: int, streams: torch.Tensor, positions: torch.Tensor,
              k: torch.Tensor, v: torch.Tensor) -> None:
        """Store rows: `k[t]`, `v[t]` (`[tokens, kv_heads, head_dim]`) at (streams[t], positions[t])."""
        view = self._views[layer]
        write_rows(view.k, view.v, streams, positions, k, v, self._native)

    def view(self, layer: int) -> StridedKV:
        return self._views[layer]  # [streams, cells, kv_heads, head_dim]

    def copy_stream(self, src: int, dst: int, n: int) -> None:
        """Copy the first `n` cells of stream `src` onto stream `dst` (all layers)."""
        assert 0 <= n <= self.spec.n_cells and src != dst
        self.k[:, dst, :n] = self.k[:, src, :n]
        self.v[:, dst, :n] = self.v[:, src, :n]

    def export_stream(self, stream: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Canonical copy of the first `n` cells: K, V each `[n_layers, n, kv_heads, head_dim]`.

        A fresh tensor owning only these cells (a view would carry the whole cache into a slot file)."""
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
        return self.k.numel() * self.k.element_size() + self.v.numel() * self.v.element_size()


def create(spec: KVSpec) -> SeqHeadDim:
    return SeqHeadDim(spec)
