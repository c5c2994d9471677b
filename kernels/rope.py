"""rope: rotary position embedding in GGML's "normal" mode (adjacent pairs 2i, 2i+1).

GGUF llama q/k weights are permuted for this mode (not the half-split "neox" form). The model
computes `cos`/`sin` once per step from a precomputed table; the op only rotates.
"""

from __future__ import annotations

import torch

OP = "rope"
TOL = {torch.float32: 1e-5, torch.bfloat16: 2e-2}


def reference(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [tokens, heads, head_dim]; cos, sin: [tokens, rot_dim/2]; rotates the first rot_dim dims.

    Written with complex numbers: pair (x[2i], x[2i+1]) is multiplied by exp(i*theta).
    """
    rot = 2 * cos.shape[-1]
    xf = x.float()
    pairs = torch.view_as_complex(xf[..., :rot].reshape(*x.shape[:-1], rot // 2, 2).contiguous())
    turn = torch.polar(torch.ones_like(cos.float()), torch.atan2(sin.float(), cos.float()))
    out = torch.view_as_real(pairs * turn.unsqueeze(1)).flatten(-2)
    return torch.cat([out, xf[..., rot:]], dim=-1).to(x.dtype)


def cpu(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    rot = 2 * cos.shape[-1]
    c, s = cos.unsqueeze(1), sin.unsqueeze(1)       # [tokens, 1, rot/2]
    x0, x1 = x[..., 0:rot:2], x[..., 1:rot:2]       # [tokens, heads, rot/2]
    out = torch.stack((x0 * c - x1 * s, x0 * s + x1 * c), dim=-1).flatten(-2)
    if rot == x.shape[-1]:
        return out.to(x.dtype)
    return torch.cat([out.to(x.dtype), x[..., rot:]], dim=-1)


def example_inputs(gen: torch.Generator, dtype: torch.dtype) -> tuple:
    tokens = int(torch.randint(1, 30, (), generator=gen))
    heads = int(torch.randint(1, 6, (), generator=gen))
    half = int(torch.randint(1, 40, (), generator=gen))
    extra = 2 * int(torch.randint(0, 3, (), generator=gen))
    x = torch.randn(tokens, heads, 2 * half + extra, generator=gen).to(dtype)
    theta = torch.rand(tokens, half, generator=gen) * 100
    return x, theta.cos().to(dtype), theta.sin().to(dtype)
