"""Precomputed rotary angles: `cos`/`sin` of `pos * theta_i` for every position up to a limit.

theta_i = base^(-2i/rope_dim) / freq_factor_i, positions scaled by `rope_scale` (linear scaling),
as llama.cpp's ggml_rope_ext computes them. Built once at load; a step only indexes it.
"""

from __future__ import annotations

import torch

from slotserver.model.spec import ModelSpec


class RopeTable:
    def __init__(self, spec: ModelSpec, max_pos: int, freq_factors: torch.Tensor | None = None,
                 device: str = "cpu") -> None:
        half = spec.rope_dim // 2
        inv = spec.rope_base ** (-2.0 * torch.arange(half, dtype=torch.float64) / spec.rope_dim)
        if freq_factors is not None:
            inv = inv / freq_factors.double()
        pos = torch.arange(max_pos, dtype=torch.float64) * spec.rope_scale
        angles = torch.outer(pos, inv)                        # [max_pos, rope_dim/2]
        self.max_pos = max_pos
        self.cos = angles.cos().float().to(device)
        self.sin = angles.sin().float().to(device)

    def lookup(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """positions: [tokens] -> cos, sin: [tokens, rope_dim/2]."""
        assert int(positions.max()) < self.max_pos, "position beyond the rope table"
        return self.cos[positions], self.sin[positions]
