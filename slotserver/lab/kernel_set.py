"""The set of op implementations the model calls, loaded from a kernels folder.

`KernelSet.load(dir)` loads every kernel file of the folder (each `<dir>/<op>.py`; the ops the model
always needs, `OPS`, must be there) and binds the implementation for the device: `cpu` on CPU,
`triton` on CUDA (or under TRITON_INTERPRET=1). The model only ever calls `kernels.<op>(...)`.
Each bound op is timed (calls and total seconds) for the lab's per-kernel timings; on CPU torch
ops are synchronous, so the wall time is the op's time.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable

from slotserver.lab.loader import LoadedModule, default_dir, load_by_path, module_names, resolve_in_folder

OPS = ("rms_norm", "rope", "attention", "silu_mul")
KERNEL_CONTRACT = ("OP", "reference", "cpu", "example_inputs", "TOL")


@dataclass
class KernelSet:
    modules: dict[str, LoadedModule] = field(default_factory=dict)
    impl: str = "cpu"
    timings: dict[str, list[float]] = field(default_factory=dict)  # op -> [calls, seconds]

    def __post_init__(self) -> None:
        self._bound = {op: self._timed(op, getattr(m.module, self.impl)) for op, m in self.modules.items()}

    @classmethod
    def load(cls, folder: Path | None = None, impl: str = "cpu") -> "KernelSet":
        folder = Path(folder) if folder is not None else default_dir("kernels")
        names = set(OPS) | set(module_names(folder))  # what the lab lists: no symlink out of the folder
        mods = {op: load_by_path(resolve_in_folder(folder, op, "kernel"), KERNEL_CONTRACT) for op in sorted(names)}
        return cls(mods, impl)

    def with_module(self, op: str, loaded: LoadedModule) -> "KernelSet":
        """A new set serving `loaded` for `op` (the old set stays valid for whoever holds it)."""
        timings = {k: list(v) for k, v in self.timings.items() if k != op}
        return replace(self, modules={**self.modules, op: loaded}, timings=timings)

    def _timed(self, op: str, fn: Callable) -> Callable:
        acc = self.timings.setdefault(op, [0, 0.0])

        def call(*args, **kwargs):
            t = time.perf_counter()
            out = fn(*args, **kwargs)
            acc[0] += 1
            acc[1] += time.perf_counter() - t
            return out

        return call

    def fn(self, op: str) -> Callable:
        return self._bound[op]

    def __getattr__(self, op: str) -> Callable:
        bound = self.__dict__.get("_bound", {})
        if op in bound:
            return bound[op]
        raise AttributeError(f"no kernel '{op}' loaded")

    def versions(self) -> dict[str, str]:
        return {op: m.version for op, m in self.modules.items()}

    def mean_ms(self) -> dict[str, float]:
        return {op: (1000 * s / n if n else 0.0) for op, (n, s) in self.timings.items()}
