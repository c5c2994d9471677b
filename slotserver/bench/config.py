"""The benchmark's settings, validated once so that every later stage can trust them.

Defaults follow `vllm bench serve` where that makes sense (all requests at once, Poisson
arrivals when a rate is given, burstiness 1, greedy sampling, `ignore_eos`), but the sizes are
scaled for a CPU server: 32 prompts of 128 tokens generating 64 each, not vLLM's 1000 x 1024.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

BACKENDS = ("openai", "llama")


class ConfigError(ValueError):
    """A bad benchmark setting or dataset file; the message names it (the CLI exits 2).

    Not `slotserver.model.config.ConfigError`: that module imports torch, which a benchmark client
    has no use for.
    """


def _positive_int(name: str, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"--{name} must be an integer >= 1, got {value!r}")


@dataclass(frozen=True)
class BenchConfig:
    base_url: str = "http://127.0.0.1:8080"
    backend: str = "openai"                # "openai": /v1/completions; "llama": /completion
    model: str | None = None               # openai "model" field; None: ask /v1/models
    input_len: int = 128                   # tokens per random prompt
    output_len: int = 64                   # tokens to generate per request (ignore_eos)
    num_prompts: int = 32
    max_concurrency: int | None = None     # None: no limit
    request_rate: float = math.inf         # requests/s; inf sends them all at once
    burstiness: float = 1.0                # gamma shape of the arrival gaps; 1 is Poisson
    seed: int = 0
    warmup: int = 0                        # requests sent (and not counted) before the run
    temperature: float = 0.0
    dataset: Path | None = None            # JSON list of prompt strings instead of random ids
    vocab_size: int | None = None          # for random prompts; None: ask /v1/models
    api_key: str | None = None
    timeout_s: float = 600.0               # per request (httpx read/connect timeout)
    json_path: Path | None = None
    progress: bool = True

    def __post_init__(self) -> None:
        if not self.base_url.startswith(("http://", "https://")):
            raise ConfigError(f"--base-url must start with http:// or https://, got {self.base_url!r}")
        object.__setattr__(self, "base_url", self.base_url.rstrip("/"))
        if self.backend not in BACKENDS:
            raise ConfigError(f"--backend must be one of {', '.join(BACKENDS)}, got {self.backend!r}")
        for name in ("input_len", "output_len", "num_prompts"):
            _positive_int(name.replace("_", "-"), getattr(self, name))
        if self.max_concurrency is not None:
            _positive_int("max-concurrency", self.max_concurrency)
        if self.vocab_size is not None:
            _positive_int("vocab-size", self.vocab_size)
        self._check_floats()
        if isinstance(self.warmup, bool) or not isinstance(self.warmup, int) or self.warmup < 0:
            raise ConfigError(f"--warmup must be an integer >= 0, got {self.warmup!r}")

    def _check_floats(self) -> None:
        if math.isnan(self.request_rate) or self.request_rate <= 0:
            raise ConfigError(f"--request-rate must be > 0 (or inf), got {self.request_rate}")
        if not math.isfinite(self.burstiness) or self.burstiness <= 0:
            raise ConfigError(f"--burstiness must be a finite number > 0, got {self.burstiness}")
        if not math.isfinite(self.temperature) or self.temperature < 0:
            raise ConfigError(f"--temperature must be >= 0, got {self.temperature}")
        if not math.isfinite(self.timeout_s) or self.timeout_s <= 0:
            raise ConfigError(f"--timeout must be > 0 seconds, got {self.timeout_s}")

    def to_json(self) -> dict[str, Any]:
        """The settings as JSON values (paths as strings, inf as "inf"); the API key is left out."""
        out = asdict(self)
        out.pop("api_key")
        out["request_rate"] = "inf" if math.isinf(self.request_rate) else self.request_rate
        for key in ("dataset", "json_path"):
            out[key] = None if out[key] is None else str(out[key])
        return out
