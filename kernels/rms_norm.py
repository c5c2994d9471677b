"""rms_norm: `y = x / sqrt(mean(x^2) + eps) * weight`, llama.cpp's RMS_NORM followed by MUL.

Contract (every kernel module): `OP`, `reference(...)` in plain torch (the ground truth), `cpu(...)`
(the implementation the CPU engine calls), `example_inputs(gen, dtype)` for validation, `TOL`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

OP = "rms_norm"
TOL = {torch.float32: 1e-5, torch.bfloat16: 2e-2}


def reference(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x: [tokens, dim], weight: [dim] -> [tokens, dim], computed in float32."""
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + eps)
    return (y * weight.float()).to(x.dtype)


def cpu(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    if x.dtype == torch.float32:
        return F.rms_norm(x, (x.shape[-1],), weight, eps)
    return F.rms_norm(x.float(), (x.shape[-1],), weight.float(), eps).to(x.dtype)


def example_inputs(gen: torch.Generator, dtype: torch.dtype) -> tuple:
    tokens = int(torch.randint(1, 40, (), generator=gen))
    dim = int(torch.randint(1, 300, (), generator=gen))
    x = torch.randn(tokens, dim, generator=gen).to(dtype)
    w = (1 + 0.1 * torch.randn(dim, generator=gen)).to(dtype)
    return x, w, 1e-5
