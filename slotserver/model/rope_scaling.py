"""RoPE scaling as a GGUF file's metadata says, with llama.cpp's defaults and formulas.

Types (`{arch}.rope.scaling.type`): none, linear (positions times `freq_scale`), yarn (NTK-by-parts
interpolation with a magnitude correction) and longrope (phi3: per-frequency factors from
`rope_factors_long/short.weight`, chosen by context size; `rope.scaling.attn_factor` scales cos/sin).
llama-3's frequency factors (`rope_freqs.weight`) need no type. Anything else is refused by name.
What llama.cpp computes (src/llama-context.cpp, ggml-cpu ops.cpp `rope_yarn`):

    freq_scale = 1 / rope.scaling.factor (1 without a factor, or for type none)
    theta      = freq_scale * theta_extrap, blended back to theta_extrap on the fast dims (yarn)
    mscale     = attn_factor (* (1 + 0.1 ln(1 / freq_scale)) for yarn)

llama-server's `--rope-scaling/--rope-scale/--rope-freq-base/--rope-freq-scale/--yarn-*` flags
(`RopeFlags`) replace the file's values as llama.cpp's context parameters do
(src/llama-context.cpp): a flag left unset keeps the file's, type none never scales, yarn's
extrapolation mix defaults to 1, and with a mix the magnitude is recomputed from the new factor
(so `--yarn-attn-factor` counts only without one, as there). The windowed layers of gemma2/3,
gemma-embedding and gpt-oss keep the file's base and scale (their llama.cpp graphs read
llama_model::get_rope_freq_base: archs.py `swa_rope_file`), which is why `ModelSpec.from_gguf`
builds the trained scaling too; other windowed layers (olmo2/3, exaone4, lfm2) take the flags.
`--yarn-orig-ctx` moves YaRN's blend only: phi3's choice of long factors and mistral3's q
temperature read the file's original context (`file_ctx`), as llama.cpp's hparams do.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

TYPES = ("none", "linear", "yarn", "longrope")
FLAG_TYPES = ("none", "linear", "yarn")   # --rope-scaling's choices (llama-server's)


@dataclass(frozen=True)
class RopeFlags:
    """The command line's rope settings; None: the file's (llama.cpp's 0 / -1 'not set')."""
    kind: str | None = None           # --rope-scaling
    freq_base: float | None = None    # --rope-freq-base
    freq_scale: float | None = None   # --rope-freq-scale, or 1 / --rope-scale
    orig_ctx: int | None = None       # --yarn-orig-ctx
    ext_factor: float | None = None   # --yarn-ext-factor
    attn_factor: float | None = None  # --yarn-attn-factor
    beta_fast: float | None = None    # --yarn-beta-fast
    beta_slow: float | None = None    # --yarn-beta-slow

    def __post_init__(self) -> None:
        from slotserver.errors import ConfigError
        if self.kind is not None and self.kind not in FLAG_TYPES:
            raise ConfigError(f"--rope-scaling must be one of {', '.join(FLAG_TYPES)}, got {self.kind!r}")
        for flag, value in (("--rope-freq-base", self.freq_base), ("--rope-freq-scale (or --rope-scale)",
                            self.freq_scale), ("--yarn-orig-ctx", self.orig_ctx)):
            if value is not None and not (value > 0 and math.isfinite(value)):
                raise ConfigError(f"{flag} must be a positive number, got {value!r}")
        for flag, value in (("--yarn-ext-factor", self.ext_factor), ("--yarn-attn-factor", self.attn_factor),
                            ("--yarn-beta-fast", self.beta_fast), ("--yarn-beta-slow", self.beta_slow)):
            if value is not None and not (value >= 0 and math.isfinite(value)):
                raise ConfigError(f"{flag} must be a number >= 0, got {value!r}")

    @classmethod
    def from_args(cls, args) -> "RopeFlags":
        """cli/model_meta_args.py's parsed flags. llama.cpp's 'not set' values read as not set: 0 for
        the base, the scale and the original context, a negative number for the other YaRN settings."""
        def get(name: str):
            return getattr(args, name, None)

        def yarn(name: str):
            value = get(name)
            return None if value is None or value < 0 else value
        return cls(kind=get("rope_scaling"), freq_base=get("rope_freq_base") or None,
                   freq_scale=get("rope_freq_scale") or None, orig_ctx=get("yarn_orig_ctx") or None,
                   ext_factor=yarn("yarn_ext_factor"), attn_factor=yarn("yarn_attn_factor"),
                   beta_fast=yarn("yarn_beta_fast"), beta_slow=yarn("yarn_beta_slow"))

    @property
    def any(self) -> bool:
        return any(v is not None for v in vars(self).values())

    def shown(self) -> str:
        """What was set, as the flags read: for the start-up log line."""
        return ", ".join(f"{k} {v}" for k, v in vars(self).items() if v is not None)


@dataclass(frozen=True)
class RopeScaling:
    kind: str = "none"
    base: float = 10000.0
    freq_scale: float = 1.0
    attn_factor: float = 1.0      # cos/sin multiplier (llama.cpp's yarn_attn_factor before rope_yarn)
    ext_factor: float = 0.0       # yarn: 1 by default, 0 otherwise
    orig_ctx: int = 0             # yarn / longrope: the pre-training context (0: unknown)
    file_ctx: int = 0             # the file's original context, whatever --yarn-orig-ctx says
    beta_fast: float = 32.0
    beta_slow: float = 1.0

    @classmethod
    def from_metadata(cls, key, rope_dim: int, flags: RopeFlags = RopeFlags(),
                      deepseek_mscale: bool = False) -> "RopeScaling":
        """key: spec_keys.py's `MetaKeys` over `{arch}.*` metadata; flags: the command line's.
        deepseek_mscale: deepseek2's YaRN magnitude (`_yarn_attn_factor`)."""
        kind = key.raw("rope.scaling.type", None)
        factor = key.float("rope.scaling.factor", 0.0) if key.has("rope.scaling.factor") else \
            key.float("rope.scale_linear", 0.0)
        if kind is None:
            kind = "linear" if factor else "none"   # llama.cpp's default type is linear
        if kind not in TYPES:
            raise key.error(f"rope scaling type {kind!r} is not supported ({', '.join(TYPES)})")
        freq_scale = 1.0 if kind == "none" or factor == 0 else 1.0 / factor
        if flags.kind == "none" or (flags.kind is None and key.raw("rope.scaling.type", None) == "none"):
            freq_scale = 1.0   # llama.cpp: never scale if the type is none (a file without a type: linear)
        elif flags.freq_scale:
            freq_scale = flags.freq_scale
        kind = flags.kind or kind
        ext_factor = _pick(flags.ext_factor, key.float("rope.scaling.yarn_ext_factor", 1.0 if kind == "yarn" else 0.0))
        if ext_factor:
            attn_factor = _yarn_attn_factor(1.0 / freq_scale, key.float("rope.scaling.yarn_log_multiplier", 0.0),
                                            deepseek_mscale)
        else:
            attn_factor = _pick(flags.attn_factor, 1.0)
        orig_ctx = key.int("rope.scaling.original_context_length", key.int("context_length"))
        return cls(
            kind=kind, base=flags.freq_base or key.float("rope.freq_base", 10000.0), freq_scale=freq_scale,
            attn_factor=attn_factor * key.float("rope.scaling.attn_factor", 1.0), ext_factor=ext_factor,
            orig_ctx=flags.orig_ctx or orig_ctx, file_ctx=orig_ctx,
            beta_fast=_pick(flags.beta_fast, key.float("rope.scaling.yarn_beta_fast", 32.0)),
            beta_slow=_pick(flags.beta_slow, key.float("rope.scaling.yarn_beta_slow", 1.0)),
        )

    def corr_dims(self, rope_dim: int, base: float) -> tuple[float, float]:
        """yarn: the pair indices between which theta blends from extrapolated to interpolated."""
        def dim(n_rot: float) -> float:
            return rope_dim * math.log(self.orig_ctx / (n_rot * 2 * math.pi)) / (2 * math.log(base))
        return max(0.0, math.floor(dim(self.beta_fast))), min(rope_dim - 1.0, math.ceil(dim(self.beta_slow)))


def _pick(flag: float | None, value: float) -> float:
    return value if flag is None else flag


def _yarn_attn_factor(factor: float, log_mul: float, deepseek: bool = False) -> float:
    """llama.cpp's cparams.yarn_attn_factor for yarn, before rope_yarn multiplies (1 + 0.1 ln factor)
    back in: 1 unless `yarn_log_multiplier` is set. deepseek2's file holds 0.1 x mscale_all_dim there
    and llama.cpp takes its mscale equal to it ([TAG_DEEPSEEK2_YARN_LOG_MUL_FIX]): the ratio is 1, so
    cos/sin keep magnitude 1 and the stretch goes into the q.k scale instead (mla_spec.py's kq_scale)."""
    def mscale(scale: float, m: float) -> float:
        return 1.0 if scale <= 1.0 else 0.1 * m * math.log(scale) + 1.0
    if deepseek and log_mul:
        base = 1.0
    else:
        base = mscale(factor, 1.0) / mscale(factor, log_mul) if log_mul else mscale(factor, 1.0)
    return base / (1.0 + 0.1 * math.log(factor)) if factor > 0 else base
