"""Speculative decoding's settings: llama-server's `--spec-*` flags, validated.

Names and defaults are the vendored llama.cpp's (common/common.h `common_params_speculative`,
common/arg.cpp): `--spec-type` takes a comma-separated list of ngram-simple, ngram-mod,
draft-simple; draft-simple needs `--spec-draft-model`. Each type keeps its own sizes, as there:
ngram-simple drafts up to `ngram_simple_size_m` tokens found after a `size_n`-token match,
ngram-mod up to `ngram_mod_n_max` (at least `ngram_mod_n_min`, or nothing) after an
`ngram_mod_n_match`-token hash hit, draft-simple `draft_n_max` greedy tokens of the draft model
(at least `draft_n_min`, stopping below `draft_p_min`). With several types, the first that
proposes a draft for a sequence in a step wins (llama.cpp's order: the list's).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from slotserver.errors import ConfigError

SPEC_TYPES = ("none", "ngram-simple", "ngram-mod", "draft-simple")


@dataclass(frozen=True)
class SpecConfig:
    types: tuple[str, ...] = ()         # empty: no speculative decoding
    draft_model: Path | None = None     # -md/--spec-draft-model: the draft-simple model
    draft_n_max: int = 3                # --spec-draft-n-max
    draft_n_min: int = 0                # --spec-draft-n-min
    draft_p_min: float = 0.0            # --spec-draft-p-min: stop drafting below this top-10 probability
    ngram_simple_size_n: int = 12       # --spec-ngram-simple-size-n: lookup n-gram
    ngram_simple_size_m: int = 48       # --spec-ngram-simple-size-m: drafted m-gram
    ngram_mod_n_match: int = 24         # --spec-ngram-mod-n-match
    ngram_mod_n_min: int = 48           # --spec-ngram-mod-n-min
    ngram_mod_n_max: int = 64           # --spec-ngram-mod-n-max
    adaptive: bool = True               # --spec-adaptive/--no-spec-adaptive: back off while drafts miss
    # --spec-synth-rates / --spec-synth-len: llama.cpp's synthetic acceptance, for benchmarking only:
    # draft position i is accepted at random with these unconditional rates (the output is not the model's)
    synth_rates: tuple[float, ...] = ()
    synth_len: float | None = None

    def __post_init__(self) -> None:
        for t in self.types:
            if t not in SPEC_TYPES:
                raise ConfigError(f"--spec-type: unknown type {t!r} (one of {', '.join(SPEC_TYPES)})")
        if "draft-simple" in self.types and self.draft_model is None:
            raise ConfigError("--spec-type draft-simple needs a draft model: -md/--spec-draft-model FILE")
        if self.draft_model is not None and not Path(self.draft_model).is_file():
            raise ConfigError(f"--spec-draft-model {self.draft_model}: no such file")
        for name in ("draft_n_max", "ngram_simple_size_n", "ngram_simple_size_m", "ngram_mod_n_match",
                     "ngram_mod_n_max"):
            _int(name, getattr(self, name), 1)
        _int("draft_n_min", self.draft_n_min, 0)
        _int("ngram_mod_n_min", self.ngram_mod_n_min, 0)
        if self.draft_n_min > self.draft_n_max:
            raise ConfigError(f"--spec-draft-n-min {self.draft_n_min} exceeds --spec-draft-n-max {self.draft_n_max}")
        if self.ngram_mod_n_min > self.ngram_mod_n_max:
            raise ConfigError(f"--spec-ngram-mod-n-min {self.ngram_mod_n_min} exceeds --spec-ngram-mod-n-max "
                              f"{self.ngram_mod_n_max}")
        if not 0.0 <= self.draft_p_min <= 1.0:
            raise ConfigError(f"--spec-draft-p-min must be in [0, 1], got {self.draft_p_min}")
        self.synth_probs   # noqa: B018 - validates the synthetic acceptance flags

    @property
    def synth_probs(self) -> tuple[float, ...]:
        """Per draft position, the probability of accepting it given the one before was accepted
        (llama.cpp's `common_speculative_synth_rates_resolve`, then rate_i / rate_i-1); () when off."""
        rates = _synth_rates(self.synth_rates, self.synth_len, self.n_max)
        probs, prev = [], 1.0
        for r in rates:
            probs.append(r / prev if prev > 0 else 0.0)
            prev = r
        return tuple(probs)

    @property
    def enabled(self) -> bool:
        return any(t != "none" for t in self.types)

    @property
    def n_max(self) -> int:
        """The longest draft any configured type proposes (the verify batch's extra rows)."""
        sizes = {"ngram-simple": self.ngram_simple_size_m, "ngram-mod": self.ngram_mod_n_max,
                 "draft-simple": self.draft_n_max}
        return max((sizes[t] for t in self.types if t in sizes), default=0)

    @staticmethod
    def parse_types(text: str | None, draft_model: Path | None) -> tuple[str, ...]:
        """`--spec-type a,b` -> ('a', 'b'); none given but a draft model -> draft-simple (llama.cpp
        infers the type from the draft's presence)."""
        if not text:
            return ("draft-simple",) if draft_model is not None else ()
        types = tuple(t.strip() for t in text.split(",") if t.strip())
        return () if types == ("none",) else types


def _int(name: str, value: int, lo: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < lo:
        flag = "--spec-" + name.replace("_", "-")
        raise ConfigError(f"{flag} must be an integer >= {lo}, got {value!r}")


def _synth_rates(rates: tuple[float, ...], length: float | None, n_max: int) -> tuple[float, ...]:
    if not rates and length is None:
        return ()
    if rates and length is not None:
        raise ConfigError("--spec-synth-len and --spec-synth-rates are mutually exclusive")
    if n_max <= 0:
        raise ConfigError("synthetic acceptance needs a speculative type (--spec-type)")
    if rates:
        if len(rates) != n_max:
            raise ConfigError(f"--spec-synth-rates must have {n_max} values (the draft's n_max), got {len(rates)}")
        if any(not 0.0 <= r <= 1.0 for r in rates) or any(b > a for a, b in zip(rates, rates[1:])):
            raise ConfigError("--spec-synth-rates must be within [0, 1] and non-increasing")
        return tuple(rates)
    if not 1.0 <= length <= n_max + 1:
        raise ConfigError(f"--spec-synth-len must be within [1, {n_max + 1}], got {length}")
    return tuple(_geometric(length, n_max) ** (i + 1) for i in range(n_max))


def _geometric(length: float, n_max: int) -> float:
    """The p whose p + p^2 + ... + p^n_max is length - 1 (32 bisection steps, as llama.cpp)."""
    if length <= 1.0 or length == n_max + 1:
        return 0.0 if length <= 1.0 else 1.0
    lo, hi = 0.0, 1.0
    for _ in range(32):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if sum(mid ** (j + 1) for j in range(n_max)) < length - 1.0 else (lo, mid)
    return 0.5 * (lo + hi)
