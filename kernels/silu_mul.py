"""silu_mul: the SwiGLU gate, `silu(gate) * up` on a fused `[tokens, 2*d_ff]` gate|up projection.

The model fuses `ffn_gate` and `ffn_up` into one matmul; this op reads its two halves.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

OP = "silu_mul"
TOL = {torch.float32: 1e-5, torch.bfloat16: 2e-2}


def reference(gate_up: torch.Tensor) -> torch.Tensor:
    """gate_up: [tokens, 2*d_ff] -> [tokens, d_ff]."""
    g, u = gate_up.float().chunk(2, dim=-1)
    return (g / (1 + torch.exp(-g)) * u).to(gate_up.dtype)


def cpu(gate_up: torch.Tensor) -> torch.Tensor:
    g, u = gate_up.chunk(2, dim=-1)
    return F.silu(g) * u


def example_inputs(gen: torch.Generator, dtype: torch.dtype) -> tuple:
    tokens = int(torch.randint(1, 40, (), generator=gen))
    d_ff = int(torch.randint(1, 300, (), generator=gen))
    return (3 * torch.randn(tokens, 2 * d_ff, generator=gen)).to(dtype),
