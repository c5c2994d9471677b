"""Precomputed rotary angles: `cos`/`sin` of `pos * theta_i` for every position up to a limit.

theta_i = base^(-2i/rope_dim) / freq_factor_i, positions scaled by the rope's freq_scale (linear
scaling), blended with the unscaled angle on the fast pairs and cos/sin multiplied by mscale for
yarn (`RopeScaling`), as llama.cpp's ggml_rope_ext computes them. Built once at load per distinct
(base, scale) of the model's layers (gemma's windowed layers have their own); a step only indexes it.
"""

from __future__ import annotations

import math

import torch

from slotserver.model.spec import ModelSpec


class RopeTable:
    def __init__(self, spec: ModelSpec, max_pos: int, freq_factors: torch.Tensor | None = None,
                 device: str = "cpu", base: float | None = None, scale: float | None = None) -> None:
        base = spec.rope_base if base is None else base
        scale = spec.rope_scale if scale is None else scale
        half, r = spec.rope_dim // 2, spec.rope
        i = torch.arange(half, dtype=torch.float64)
        inv = base ** (-2.0 * i / spec.rope_dim)
        if freq_factors is not None:
            inv = inv / freq_factors.double().cpu()
        pos = torch.arange(max_pos, dtype=torch.float64)
        extrap = torch.outer(pos, inv)                         # [max_pos, rope_dim/2]
        angles, mscale = extrap * scale, r.attn_factor
        if r.ext_factor and scale != 1.0:
            low, high = r.corr_dims(spec.rope_dim, base)
            ramp = 1 - ((i - low) / max(0.001, high - low)).clamp(0, 1)
            mix = ramp * r.ext_factor                          # [rope_dim/2]: 1 = keep the extrapolated angle
            angles = angles * (1 - mix) + extrap * mix
            mscale *= 1.0 + 0.1 * math.log(1.0 / scale)
        self.max_pos = max_pos
        self.cos = (angles.cos() * mscale).float().to(device)
        self.sin = (angles.sin() * mscale).float().to(device)

    def lookup(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """positions: [tokens] -> cos, sin: [tokens, rope_dim/2]. The caller checks the positions
        against max_pos (LlamaModel.forward, from the batch's host-side max_kv: reading them back
        would cost a reduction on the CPU and a wait on a GPU every step)."""
        return self.cos[positions], self.sin[positions]
