"""RoPE scaling as a GGUF file's metadata says, with llama.cpp's defaults and formulas.

Types (`{arch}.rope.scaling.type`): none, linear (positions times `freq_scale`), yarn (NTK-by-parts
interpolation with a magnitude correction) and longrope (phi3: per-frequency factors from
`rope_factors_long/short.weight`, chosen by context size; `rope.scaling.attn_factor` scales cos/sin).
llama-3's frequency factors (`rope_freqs.weight`) need no type. Anything else is refused by name.
What llama.cpp computes (src/llama-context.cpp, ggml-cpu ops.cpp `rope_yarn`):

    freq_scale = 1 / rope.scaling.factor (1 without a factor, or for type none)
    theta      = freq_scale * theta_extrap, blended back to theta_extrap on the fast dims (yarn)
    mscale     = attn_factor (* (1 + 0.1 ln(1 / freq_scale)) for yarn)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

TYPES = ("none", "linear", "yarn", "longrope")


@dataclass(frozen=True)
class RopeScaling:
    kind: str = "none"
    base: float = 10000.0
    freq_scale: float = 1.0
    attn_factor: float = 1.0      # cos/sin multiplier (llama.cpp's yarn_attn_factor before rope_yarn)
    ext_factor: float = 0.0       # yarn: 1 by default, 0 otherwise
    orig_ctx: int = 0             # yarn / longrope: the pre-training context (0: unknown)
    beta_fast: float = 32.0
    beta_slow: float = 1.0

    @classmethod
    def from_metadata(cls, key, rope_dim: int) -> "RopeScaling":
        """key: spec_keys.py's `MetaKeys` over `{arch}.*` metadata."""
        kind = key.raw("rope.scaling.type", None)
        factor = key.float("rope.scaling.factor", 0.0) if key.has("rope.scaling.factor") else \
            key.float("rope.scale_linear", 0.0)
        if kind is None:
            kind = "linear" if factor else "none"   # llama.cpp's default type is linear
        if kind not in TYPES:
            raise key.error(f"rope scaling type {kind!r} is not supported ({', '.join(TYPES)})")
        freq_scale = 1.0 if kind == "none" or factor == 0 else 1.0 / factor
        attn_factor = key.float("rope.scaling.attn_factor", 1.0)
        ext_factor = key.float("rope.scaling.yarn_ext_factor", 1.0 if kind == "yarn" else 0.0)
        if ext_factor:
            attn_factor *= _yarn_attn_factor(1.0 / freq_scale, key.float("rope.scaling.yarn_log_multiplier", 0.0))
        return cls(
            kind=kind, base=key.float("rope.freq_base", 10000.0), freq_scale=freq_scale, attn_factor=attn_factor,
            ext_factor=ext_factor, orig_ctx=key.int("rope.scaling.original_context_length", key.int("context_length")),
            beta_fast=key.float("rope.scaling.yarn_beta_fast", 32.0), beta_slow=key.float("rope.scaling.yarn_beta_slow", 1.0),
        )

    def corr_dims(self, rope_dim: int, base: float) -> tuple[float, float]:
        """yarn: the pair indices between which theta blends from extrapolated to interpolated."""
        def dim(n_rot: float) -> float:
            return rope_dim * math.log(self.orig_ctx / (n_rot * 2 * math.pi)) / (2 * math.log(base))
        return max(0.0, math.floor(dim(self.beta_fast))), min(rope_dim - 1.0, math.ceil(dim(self.beta_slow)))


def _yarn_attn_factor(factor: float, log_mul: float) -> float:
    """llama.cpp's cparams.yarn_attn_factor for yarn, before rope_yarn multiplies (1 + 0.1 ln factor)
    back in: 1 unless `yarn_log_multiplier` is set."""
    def mscale(scale: float, m: float) -> float:
        return 1.0 if scale <= 1.0 else 0.1 * m * math.log(scale) + 1.0
    base = mscale(factor, 1.0) / mscale(factor, log_mul) if log_mul else mscale(factor, 1.0)
    return base / (1.0 + 0.1 * math.log(factor)) if factor > 0 else base
