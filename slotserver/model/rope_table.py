"""Precomputed rotary angles: `cos`/`sin` of `pos * theta_i` for every position up to a limit.

theta_i = base^(-2i/rope_dim) / freq_factor_i, positions scaled by the rope's freq_scale (linear
scaling), blended with the unscaled angle on the fast pairs and cos/sin multiplied by mscale for
yarn (`RopeScaling`), as llama.cpp's ggml_rope_ext computes them. Built once at load per distinct
(base, scale) of the model's layers (gemma's windowed layers have their own); a step only indexes it.

`rotation(delta)` gives the same angles for position *offsets* without mscale: what turns a key
stored at position p into the key at p + delta (a KV shift, model/rope_shift.py). Every variant
here is a rotation whose angle is linear in the position, so R(p + d) = R(d) R(p) exactly in real
arithmetic; one `_angles` formula serves the table and the shifts, so the two cannot drift apart.

`rotated=False` is the table of a layer without RoPE (smollm3's NoPE layers): every angle 0 and
mscale 1, so cos = 1 and sin = 0 exactly, and the rope kernel's x*cos - y*sin, y*cos + x*sin give
back q and k bit for bit (and a KV shift rotates nothing). Why a table and not a branch: every
forward (the C step graphs, the Triton bodies, --tp's ranks) already takes a table per layer.
"""

from __future__ import annotations

import math

import torch

from slotserver.model.spec import ModelSpec


class RopeTable:
    def __init__(self, spec: ModelSpec, max_pos: int, freq_factors: torch.Tensor | None = None,
                 device: str = "cpu", base: float | None = None, scale: float | None = None,
                 rotated: bool = True, scaled: bool = True) -> None:
        self.spec, self.device, self.rotated, self.scaled = spec, device, rotated, scaled
        self.base = spec.rope_base if base is None else base
        self.scale = spec.rope_scale if scale is None else scale
        self.freq_factors = None if freq_factors is None else freq_factors.double().cpu()
        angles, mscale = self._angles(torch.arange(max_pos, dtype=torch.float64))
        self.max_pos = max_pos
        self.cos = (angles.cos() * mscale).float().to(device)
        self.sin = (angles.sin() * mscale).float().to(device)

    def _angles(self, pos: torch.Tensor) -> tuple[torch.Tensor, float]:
        """pos: [n] float64 positions (or offsets) -> (angles [n, rope_dim/2] float64, mscale)."""
        spec, base, scale = self.spec, self.base, self.scale
        half, r = spec.rope_dim // 2, spec.rope
        if not self.rotated:
            return torch.zeros(pos.shape[0], half, dtype=torch.float64), 1.0
        i = torch.arange(half, dtype=torch.float64)
        inv = base ** (-2.0 * i / spec.rope_dim)
        if self.freq_factors is not None:
            inv = inv / self.freq_factors
        if spec.still_pairs:   # M-RoPE's pairs that text leaves unrotated (their position is 0)
            inv[list(spec.still_pairs)] = 0.0
        if not self.scaled:   # olmo2's windowed layers: llama.cpp passes ext_factor 0, attn_factor 1
            return torch.outer(pos, inv) * scale, 1.0
        extrap = torch.outer(pos, inv)                         # [n, rope_dim/2]
        angles, mscale = extrap * scale, r.attn_factor
        if r.ext_factor and scale != 1.0:
            low, high = r.corr_dims(spec.rope_dim, base)
            ramp = 1 - ((i - low) / max(0.001, high - low)).clamp(0, 1)
            mix = ramp * r.ext_factor                          # [rope_dim/2]: 1 = keep the extrapolated angle
            angles = angles * (1 - mix) + extrap * mix
            mscale *= 1.0 + 0.1 * math.log(1.0 / scale)
        return angles, mscale

    def lookup(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """positions: [tokens] -> cos, sin: [tokens, rope_dim/2]. The caller checks the positions
        against max_pos (LlamaModel.forward, from the batch's host-side max_kv: reading them back
        would cost a reduction on the CPU and a wait on a GPU every step)."""
        return self.cos[positions], self.sin[positions]

    def rotation(self, delta: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """delta: [n] position offsets (any sign) -> cos, sin [n, rope_dim/2] float32 on the table's
        device: the pure rotation by each offset, without the table's mscale (a stored key already
        carries it once)."""
        angles, _ = self._angles(delta.detach().cpu().double())
        return angles.cos().float().to(self.device), angles.sin().float().to(self.device)
