"""q8: int8 K/V with one float32 scale per (stream, cell, kv_head), `[layer, stream, cell, kv_head, head_dim]`.

Symmetric absmax quantization of each head's row: `scale = max|x| / 127`, `q = round(x / scale)`,
value = `q * scale`. A row of `head_dim` values costs `head_dim + 4` bytes instead of
`2 * head_dim` (bf16) or `4 * head_dim` (float32): about half the memory of bf16 at head_dim 64,
for a relative error of about 0.5% per value (half a quantization step of the row's absmax).

Storage order is `seq_head_dim`'s, so copy/export/import are slices; `view` hands attention
`StridedKV(k_int8, v_int8, k_scale, v_scale)` and the kernels dequantize on the fly.
`export_stream` dequantizes to `spec.dtype` (the canonical form is unquantized), so migrating a
stream into q8 and back costs one rounding.
"""

from __future__ import annotations

import torch

from slotserver.runtime.kv_spec import KVSpec, StridedKV

NAME = "q8"
KV_TYPE = "q8"   # int8 + a float32 scale per row, not the float cache type: /lab and top say so (kv_cache.py)
QMAX = 127
TOL = 1e-2  # read-back error relative to the values' magnitude (lossy: <= absmax / 254 per row)


def quantize(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x: [..., head_dim] -> (int8 [..., head_dim], float32 scale [...]); all-zero rows get scale 0."""
    xf = x.float()
    scale = xf.abs().amax(dim=-1) / QMAX                           # [...]
    inv = torch.where(scale > 0, 1.0 / scale, torch.zeros_like(scale))
    q = torch.floor(xf * inv.unsqueeze(-1) + 0.5).clamp_(-QMAX, QMAX)  # round half up
    return q.to(torch.int8), scale


def dequantize(q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return (q.float() * scale.unsqueeze(-1)).to(dtype)


class Q8:
    """int8 K/V `[n_layers, n_streams, n_cells, n_kv_heads, head_dim]` + float32 scales without head_dim."""

    name = NAME

    def __init__(self, spec: KVSpec) -> None:
        self.spec = spec
        shape = (spec.n_layers, spec.n_streams, spec.n_cells, spec.n_kv_heads, spec.head_dim)
        self.k = spec.zeros(shape, torch.int8)
        self.v = spec.zeros(shape, torch.int8)
        self.k_scale = spec.zeros(shape[:-1], torch.float32)
        self.v_scale = spec.zeros(shape[:-1], torch.float32)

    def write(self, layer: int, streams: torch.Tensor, positions: torch.Tensor,
              k: torch.Tensor, v: torch.Tensor) -> None:
        """Quantize and store rows `k[t]`, `v[t]` (`[tokens, kv_heads, head_dim]`) at (streams[t], positions[t])."""
        for data, scales, rows in ((self.k, self.k_scale, k), (self.v, self.v_scale, v)):
            q, scale = quantize(rows)
            data[layer].index_put_((streams, positions), q)
            scales[layer].index_put_((streams, positions), scale)

    def view(self, layer: int) -> StridedKV:
        return StridedKV(self.k[layer], self.v[layer], self.k_scale[layer], self.v_scale[layer])

    def copy_stream(self, src: int, dst: int, n: int) -> None:
        """Copy the first `n` cells of stream `src` onto stream `dst` (quantized, no re-rounding)."""
        assert 0 <= n <= self.spec.n_cells and src != dst
        for t in (self.k, self.v, self.k_scale, self.v_scale):
            t[:, dst, :n] = t[:, src, :n]

    def export_stream(self, stream: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Dequantized first `n` cells: K, V each `[n_layers, n, kv_heads, head_dim]` in `spec.dtype`."""
        assert 0 <= n <= self.spec.n_cells
        k = dequantize(self.k[:, stream, :n], self.k_scale[:, stream, :n], self.spec.dtype)
        v = dequantize(self.v[:, stream, :n], self.v_scale[:, stream, :n], self.spec.dtype)
        return k, v

    def import_stream(self, stream: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """Quantize canonical K/V into the first cells of `stream`."""
        n = k.shape[1]
        assert k.shape == v.shape == (self.spec.n_layers, n, self.spec.n_kv_heads, self.spec.head_dim)
        assert n <= self.spec.n_cells
        for data, scales, rows in ((self.k, self.k_scale, k), (self.v, self.v_scale, v)):
            q, scale = quantize(rows)
            data[:, stream, :n] = q
            scales[:, stream, :n] = scale

    def bytes_used(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.k, self.v, self.k_scale, self.v_scale))


def create(spec: KVSpec) -> Q8:
    return Q8(spec)
