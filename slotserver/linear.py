"""A weight matrix kept in the formats that make its matmul fastest for each batch size.

On CPU a decode step with few tokens is bound by reading the weights, so int8 weight-only
matmuls (`torch._weight_int8pack_mm`, per-row scales) win there; with many tokens the matmul is
compute-bound and the dense bf16 (or f32) GEMM wins. `Linear` keeps the formats it was asked for
and picks per call by the number of rows: int8 up to `int8_max_rows`, dense above.
The int8 copy is a per-row absmax re-quantization of the dequantized GGUF weight.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

WEIGHT_FORMATS = ("dense", "int8", "auto")


@dataclass
class Linear:
    dense: torch.Tensor | None          # [out, in] compute dtype
    bias: torch.Tensor | None           # [out]
    q8: torch.Tensor | None = None      # [out, in] int8
    q8_scale: torch.Tensor | None = None  # [out] compute dtype
    int8_max_rows: int = 0

    @classmethod
    def build(cls, w: torch.Tensor, bias: torch.Tensor | None, fmt: str, int8_max_rows: int) -> "Linear":
        """w: [out, in] in the compute dtype. fmt: dense | int8 (only) | auto (both)."""
        assert fmt in WEIGHT_FORMATS, fmt
        if fmt == "dense" or int8_max_rows <= 0:
            return cls(w, bias)
        scale = (w.float().abs().amax(dim=1) / 127.0).clamp_min(1e-12)   # [out]
        q = torch.round(w.float() / scale[:, None]).clamp_(-127, 127).to(torch.int8)
        dense = w if fmt == "auto" else None
        rows = int8_max_rows if fmt == "auto" else 1 << 30
        return cls(dense, bias, q.contiguous(), scale.to(w.dtype), rows)

    @property
    def out_features(self) -> int:
        return (self.dense if self.dense is not None else self.q8).shape[0]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """x: [rows, in] -> [rows, out]."""
        if self.q8 is not None and x.shape[0] <= self.int8_max_rows:
            y = torch._weight_int8pack_mm(x.to(self.q8_scale.dtype), self.q8, self.q8_scale)
            return y if self.bias is None else y + self.bias
        return F.linear(x, self.dense, self.bias)

    def nbytes(self) -> int:
        parts = (self.dense, self.bias, self.q8, self.q8_scale)
        return sum(t.numel() * t.element_size() for t in parts if t is not None)
