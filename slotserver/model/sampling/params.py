"""Sampling parameters: what a client asked for, as a validated, immutable `SamplingParams`.

This is the request-side half of sampling. Request parsing, sequences and the CLI need it without
the torch sampler, so "what to sample with" lives apart from "how the sampler runs"
(slotserver/model/sampling/sampler.py, which re-exports these names). Defaults are llama.cpp's; invalid values
raise SamplingError.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
import dataclasses
from dataclasses import dataclass

from slotserver.errors import SamplingError  # noqa: F401  re-export: defined without torch in slotserver.errors
from slotserver.model.sampling.order import DEFAULT_SAMPLERS, SamplersError, parse_samplers

MAX_N_PROBS = 100
ADDITIVE_LIMIT = 1e6   # |logit_bias| and the additive penalties: past it float32 logits overflow
_I32 = 2**31 - 1
# The request parser's range for each sampling field a body or a server flag may set (server/params.py
# reads every one within it; cli/sampling_args.py checks `--top-p` & co. against the same, so a
# server default never makes a request fail).
REQUEST_BOUNDS: dict[str, tuple[float, float]] = {
    "top_k": (-_I32, _I32), "top_p": (0.0, 1.0), "min_p": (0.0, 1.0), "typical_p": (0.0, 1.0),
    "xtc_probability": (0.0, 1.0), "xtc_threshold": (0.0, 1.0), "repeat_penalty": (1e-3, 1e3),
    "repeat_last_n": (-1, _I32), "presence_penalty": (-ADDITIVE_LIMIT, ADDITIVE_LIMIT),
    "frequency_penalty": (-ADDITIVE_LIMIT, ADDITIVE_LIMIT), "top_n_sigma": (-ADDITIVE_LIMIT, ADDITIVE_LIMIT),
    "dynatemp_range": (-ADDITIVE_LIMIT, ADDITIVE_LIMIT), "dynatemp_exponent": (-1e3, 1e3),
    "dry_multiplier": (-ADDITIVE_LIMIT, ADDITIVE_LIMIT), "dry_base": (0.0, ADDITIVE_LIMIT),
    "dry_allowed_length": (0, _I32), "dry_penalty_last_n": (0, _I32), "mirostat": (0, 2),
    "mirostat_tau": (-ADDITIVE_LIMIT, ADDITIVE_LIMIT), "mirostat_eta": (-ADDITIVE_LIMIT, ADDITIVE_LIMIT),
    "adaptive_target": (-ADDITIVE_LIMIT, 1.0), "adaptive_decay": (0.0, 0.99), "n_keep": (-1, _I32),
}


def _real(name: str, value: object, *, lo: float = -math.inf, hi: float = math.inf, positive: bool = False) -> float:
    """Validate a finite real in [lo, hi] (and > 0 if `positive`; bools rejected); return it as a float."""
    ok = isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(float(value))
    if not ok or not lo <= float(value) <= hi or (positive and float(value) <= 0):
        rng = " > 0" if positive else "" if (lo, hi) == (-math.inf, math.inf) else f" in [{lo}, {hi}]"
        raise SamplingError(f"{name} must be a finite number{rng}, got {value!r}")
    return float(value)


def _int(name: str, value: object, *, lo: int | None = None, hi: int | None = None) -> int:
    """Validate an integer in [lo, hi] (bools rejected) and return it as an int."""
    if not isinstance(value, numbers.Integral) or isinstance(value, bool):
        raise SamplingError(f"{name} must be an integer, got {value!r}")
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        raise SamplingError(f"{name} must be in [{lo}, {hi if hi is not None else 'inf'}], got {value!r}")
    return int(value)


def _logit_bias(value: object) -> tuple[tuple[int, float], ...]:
    """Normalise a mapping or iterable of (token, bias) pairs; -inf forbids, +inf and NaN are rejected."""
    try:
        pairs = [tuple(pair) for pair in (value.items() if isinstance(value, Mapping) else value)]  # type: ignore
    except TypeError:
        pairs = [()]
    out = []
    for pair in pairs:
        if len(pair) != 2:
            raise SamplingError(f"logit_bias must be (token, bias) pairs, got {value!r}")
        token, bias = _int("logit_bias token", pair[0], lo=0), pair[1]
        if not isinstance(bias, numbers.Real) or isinstance(bias, bool) or math.isnan(bias) or bias == math.inf:
            raise SamplingError(f"logit_bias bias for token {token} must be a number or -inf, got {bias!r}")
        out.append((token, float(bias)))
    return tuple(out)


def _bool(name: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise SamplingError(f"{name} must be true or false, got {value!r}")
    return value


def _samplers(value: object) -> tuple[str, ...]:
    try:
        return parse_samplers(value)
    except SamplersError as e:
        raise SamplingError(str(e)) from None


def _breakers(value: object) -> tuple[tuple[int, tuple[int, ...]], ...]:
    """DRY's processed sequence breakers: (head token, tail tokens) pairs."""
    try:
        out = tuple((_int("dry_breakers head", h, lo=0), tuple(_int("dry_breakers tail", t, lo=0) for t in tail))
                    for h, tail in value)  # type: ignore[union-attr]
    except (TypeError, ValueError) as e:
        raise SamplingError(f"dry_breakers must be (head, tail tokens) pairs, got {value!r}") from e
    return out


@dataclass(frozen=True)
class SamplingParams:
    """Per-request sampling settings with llama.cpp defaults; invalid values raise SamplingError."""

    temperature: float = 0.8  # <= 0: greedy
    top_k: int = 40  # <= 0 (or >= vocab): off
    top_p: float = 0.95  # 1.0: off
    min_p: float = 0.05  # 0: off
    repeat_penalty: float = 1.0  # 1.0: off
    repeat_last_n: int = 64  # penalty window; 0 disables penalties, -1 = whole history
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token, bias); -inf forbids; a mapping is accepted
    seed: int = -1  # -1: fresh random seed when the sequence's RNG is created
    n_probs: int = 0  # report the top-n probabilities of each sampled position
    post_sampling_probs: bool = False  # report them after the sampler chain instead of from the raw logits
    min_keep: int = 0  # top_p, min_p, typical_p and XTC keep at least this many candidates
    typical_p: float = 1.0  # 1.0: off
    top_n_sigma: float = -1.0  # <= 0: off
    xtc_probability: float = 0.0  # 0: off
    xtc_threshold: float = 0.1  # > 0.5: off
    dynatemp_range: float = 0.0  # 0: off; temperature in [temperature - range, temperature + range]
    dynatemp_exponent: float = 1.0
    dry_multiplier: float = 0.0  # 0: off
    dry_base: float = 1.75
    dry_allowed_length: int = 2
    dry_penalty_last_n: int = 64  # -1: whole history, 0: off
    dry_breakers: tuple[tuple[int, tuple[int, ...]], ...] = ()  # (head token, tail tokens), see sampling/dry.py
    mirostat: int = 0  # 0: off, 1: Mirostat, 2: Mirostat 2.0 (replaces the whole chain, as in llama.cpp)
    mirostat_tau: float = 5.0
    mirostat_eta: float = 0.1
    adaptive_target: float = -1.0  # adaptive-p's target probability; < 0: plain draw
    adaptive_decay: float = 0.9
    samplers: tuple[str, ...] = DEFAULT_SAMPLERS  # order of the chain; names, aliases or a string of letters

    def __post_init__(self) -> None:
        checked = {
            "temperature": _real("temperature", self.temperature),
            "top_k": _int("top_k", self.top_k),
            "top_p": _real("top_p", self.top_p, lo=0.0, hi=1.0),
            "min_p": _real("min_p", self.min_p, lo=0.0, hi=1.0),
            "repeat_penalty": _real("repeat_penalty", self.repeat_penalty, positive=True),
            "repeat_last_n": _int("repeat_last_n", self.repeat_last_n, lo=-1),
            "presence_penalty": _real("presence_penalty", self.presence_penalty),
            "frequency_penalty": _real("frequency_penalty", self.frequency_penalty),
            "logit_bias": _logit_bias(self.logit_bias),
            "seed": _int("seed", self.seed, lo=-1),
            "n_probs": _int("n_probs", self.n_probs, lo=0, hi=MAX_N_PROBS),
            **self._chain_checks(),
        }
        for name, value in checked.items():  # store normalised types (float, int, tuple)
            object.__setattr__(self, name, value)

    def _chain_checks(self) -> dict[str, object]:
        """The samplers beyond top_k/top_p/min_p/temperature; ranges are llama-server's where it has
        them, and otherwise the ones outside which float32 logits overflow."""
        return {
            "post_sampling_probs": _bool("post_sampling_probs", self.post_sampling_probs),
            "min_keep": _int("min_keep", self.min_keep, lo=0),
            "typical_p": _real("typical_p", self.typical_p, lo=0.0, hi=1.0),
            "top_n_sigma": _real("top_n_sigma", self.top_n_sigma, lo=-1e6, hi=1e6),
            "xtc_probability": _real("xtc_probability", self.xtc_probability, lo=0.0, hi=1.0),
            "xtc_threshold": _real("xtc_threshold", self.xtc_threshold, lo=0.0, hi=1.0),
            "dynatemp_range": _real("dynatemp_range", self.dynatemp_range, lo=-1e6, hi=1e6),
            "dynatemp_exponent": _real("dynatemp_exponent", self.dynatemp_exponent, lo=-1e3, hi=1e3),
            "dry_multiplier": _real("dry_multiplier", self.dry_multiplier, lo=-1e6, hi=1e6),
            "dry_base": _real("dry_base", self.dry_base, lo=0.0, hi=1e6),
            "dry_allowed_length": _int("dry_allowed_length", self.dry_allowed_length, lo=0),
            "dry_penalty_last_n": _int("dry_penalty_last_n", self.dry_penalty_last_n, lo=-1),
            "dry_breakers": _breakers(self.dry_breakers),
            "mirostat": _int("mirostat", self.mirostat, lo=0, hi=2),
            "mirostat_tau": _real("mirostat_tau", self.mirostat_tau, lo=-1e6, hi=1e6),
            "mirostat_eta": _real("mirostat_eta", self.mirostat_eta, lo=-1e6, hi=1e6),
            "adaptive_target": _real("adaptive_target", self.adaptive_target, lo=-1e6, hi=1.0),
            "adaptive_decay": _real("adaptive_decay", self.adaptive_decay, lo=0.0, hi=0.99),
            "samplers": _samplers(self.samplers),
        }

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0

    @property
    def dry_active(self) -> bool:
        """llama.cpp's DRY is a no-op unless multiplier != 0, base >= 1 and a window is set."""
        return self.dry_multiplier != 0 and self.dry_base >= 1 and self.dry_penalty_last_n != 0

    @property
    def plain_chain(self) -> bool:
        """True when the chain is llama.cpp's default with only penalties, top_k, top_p, min_p and
        temperature active: the batched fast path samples such rows exactly as the full chain would."""
        return (
            self.mirostat == 0 and self.samplers == DEFAULT_SAMPLERS and self.min_keep == 0
            and self.typical_p >= 1 and self.top_n_sigma <= 0 and not self.dry_active
            and (self.xtc_probability <= 0 or self.xtc_threshold > 0.5) and self.dynatemp_range <= 0
        )

    @property
    def penalties_active(self) -> bool:
        """As in llama.cpp, penalties are a no-op with an empty window or neutral values."""
        neutral = self.repeat_penalty == 1.0 and self.presence_penalty == 0 and self.frequency_penalty == 0
        return self.repeat_last_n != 0 and not neutral


def ignore_eos_params(params: SamplingParams, eog: frozenset[int]) -> SamplingParams:
    """`ignore_eos` is a -inf logit bias on every end-of-generation token, as in llama.cpp. (Here,
    beside the parameters it edits: the engine and model/generate.py both use it, and the model
    layer must not import the engine's.)"""
    bias = tuple(params.logit_bias) + tuple((t, -math.inf) for t in sorted(eog))
    return dataclasses.replace(params, logit_bias=bias)
