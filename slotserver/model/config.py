"""Explicit, validated configuration of what to load and how to run it. No module globals."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from slotserver.lab import cpu_features

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


class ConfigError(ValueError):
    """A bad setting; the message names it."""


@dataclass(frozen=True)
class ModelConfig:
    model_path: Path
    dtype: str = "float32"
    threads: int = 0                 # 0: leave torch's default
    layout: str = "seq_head_dim"
    kernels_dir: Path | None = None  # None: the repository's kernels/
    layouts_dir: Path | None = None  # None: the repository's layouts/
    max_ctx: int = 0                 # 0: the model's training context
    weights: str = "dense"           # dense | int8 | int4 | auto / auto4 (int8 / int4 for small batches, dense above)

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise ConfigError(f"--dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}")
        if not isinstance(self.threads, int) or self.threads < 0:
            raise ConfigError(f"--threads must be >= 0, got {self.threads!r}")
        if not isinstance(self.max_ctx, int) or self.max_ctx < 0:
            raise ConfigError(f"context size must be >= 0, got {self.max_ctx!r}")
        if self.weights not in ("dense", "int8", "int4", "auto", "auto4"):
            raise ConfigError(f"--weights must be dense, int8, int4, auto or auto4, got {self.weights!r}")
        try:
            cpu_features.current()   # SLOTSERVER_CPU: a typo is an error at startup, not at the first kernel build
        except cpu_features.CpuVariantError as e:
            raise ConfigError(str(e)) from None
        for name in ("kernels_dir", "layouts_dir"):
            folder = getattr(self, name)
            if folder is not None and not Path(folder).is_dir():
                raise ConfigError(f"--{name.replace('_', '-')} {folder} is not a folder")

    @property
    def weight_format(self):
        from slotserver.model.weights import WeightFormat

        return WeightFormat(self.weights)  # row thresholds: measured defaults, see WeightFormat

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]
