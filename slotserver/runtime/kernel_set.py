"""The set of op implementations the model calls, loaded from a kernels folder.

`KernelSet.load(dir)` loads every kernel file of the folder (each `<dir>/<op>.py`; the ops the model
always needs, `OPS`, must be there) and binds the implementation for the device: `cpu` on CPU,
`triton` on CUDA (or under TRITON_INTERPRET=1). The model only ever calls `kernels.<op>(...)`.
Each bound op counts its calls and times one call in `TIME_EVERY` for the lab's per-kernel mean
(on CPU torch ops are synchronous, so the wall time is the op's time): timing every call cost two
clock reads per op, ~300 ops per decode step. Bound ops are instance attributes, so `ks.rms_norm`
is a plain attribute read, not a `__getattr__` call.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable

import torch

from slotserver.runtime.loader import (LoadedModule, ModuleLoadError, Source, default_dir, load_source, module_names,
                                   read_source, resolve_in_folder)

OPS = ("rms_norm", "rope", "attention", "silu_mul")
KERNEL_CONTRACT = ("OP", "reference", "cpu", "triton", "example_inputs", "TOL")
CALLABLES = ("reference", "cpu", "triton", "example_inputs")


def contract_problem(module, path: Path) -> str | None:
    """Why `module` (loaded from `path`) breaks the kernel contract, naming file and name; or None.

    Every kernel module has the same parts: `OP` (its file's name), `reference` (plain torch, the
    ground truth), `cpu`, `triton`, `example_inputs(gen, dtype)` and `TOL` (dtype -> tolerance,
    float32 at least). The lab's reload, `slotserver lab check` and the model's load all refuse a
    module that lacks one, so no op serves without a reference to be validated against.
    """
    missing = [n for n in KERNEL_CONTRACT if not hasattr(module, n)]
    if missing:
        return f"{path}: missing contract name(s): {', '.join(missing)}"
    not_callable = [n for n in CALLABLES if not callable(getattr(module, n))]
    if not_callable:
        return f"{path}: contract name(s) not callable: {', '.join(not_callable)}"
    if module.OP != Path(path).stem:
        return f"{path}: OP is {module.OP!r}, expected {Path(path).stem!r} (the file's name)"
    tol = module.TOL
    if not isinstance(tol, dict) or not isinstance(tol.get(torch.float32), (int, float)):
        return f"{path}: TOL must map torch.float32 (at least) to a tolerance"
    return None


def load_kernel(src: Source) -> LoadedModule:
    """Execute a kernel file's bytes and enforce the contract (ModuleLoadError naming the part)."""
    loaded = load_source(src, KERNEL_CONTRACT)
    problem = contract_problem(loaded.module, src.path)
    if problem:
        raise ModuleLoadError(problem)
    return loaded


TIME_EVERY = 8   # one call in 8 is timed: a steady op's mean is the same, two clock reads per 8 calls


@dataclass
class KernelSet:
    modules: dict[str, LoadedModule] = field(default_factory=dict)
    impl: str = "cpu"
    timings: dict[str, list[float]] = field(default_factory=dict)  # op -> [calls, seconds]

    def __post_init__(self) -> None:
        self._bound = {op: self._timed(op, getattr(m.module, self.impl)) for op, m in self.modules.items()}
        # what each module fuses (its optional FUSES: see kernels/qmatmul.py); the model asks only those
        self.fuses = {op: frozenset(getattr(m.module, "FUSES", ())) for op, m in self.modules.items()}
        fields = {"modules", "impl", "timings", "_bound", "fuses"}
        for op, fn in self._bound.items():
            if op not in fields and not hasattr(type(self), op):
                self.__dict__[op] = fn

    @classmethod
    def load(cls, folder: Path | None = None, impl: str = "cpu") -> "KernelSet":
        folder = Path(folder) if folder is not None else default_dir("kernels")
        names = set(OPS) | set(module_names(folder))  # what the lab lists: no symlink out of the folder
        mods = {op: load_kernel(read_source(resolve_in_folder(folder, op, "kernel"))) for op in sorted(names)}
        return cls(mods, impl)

    def with_module(self, op: str, loaded: LoadedModule) -> "KernelSet":
        """A new set serving `loaded` for `op` (the old set stays valid for whoever holds it)."""
        timings = {k: list(v) for k, v in self.timings.items() if k != op}
        return replace(self, modules={**self.modules, op: loaded}, timings=timings)

    def _timed(self, op: str, fn: Callable) -> Callable:
        """`fn` counting its calls in timings[op][0], timing one in TIME_EVERY: timings[op][1] is
        their seconds and timings[op][2] how many were timed (mean_ms divides by that)."""
        acc = self.timings.setdefault(op, [0, 0.0, 0])
        while len(acc) < 3:
            acc.append(0)

        def call(*args, **kwargs):
            acc[0] += 1
            if acc[0] % TIME_EVERY:
                return fn(*args, **kwargs)
            t = time.perf_counter()
            out = fn(*args, **kwargs)
            acc[1] += time.perf_counter() - t
            acc[2] += 1
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
        return {op: (1000 * acc[1] / acc[2] if acc[2] else 0.0) for op, acc in self.timings.items()}
