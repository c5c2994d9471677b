"""Sampling parameters: what a client asked for, as a validated, immutable `SamplingParams`.

This is the request-side half of sampling. Request parsing, sequences and the CLI need it without
the torch sampler, so "what to sample with" lives apart from "how the sampler runs"
(slotserver/sampling.py, which re-exports these names). Defaults are llama.cpp's; invalid values
raise SamplingError.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from dataclasses import dataclass

MAX_N_PROBS = 100


class SamplingError(ValueError):
    """A sampling parameter or sampler input is invalid; the message names the culprit."""


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
        }
        for name, value in checked.items():  # store normalised types (float, int, tuple)
            object.__setattr__(self, name, value)

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0

    @property
    def penalties_active(self) -> bool:
        """As in llama.cpp, penalties are a no-op with an empty window or neutral values."""
        neutral = self.repeat_penalty == 1.0 and self.presence_penalty == 0 and self.frequency_penalty == 0
        return self.repeat_last_n != 0 and not neutral
