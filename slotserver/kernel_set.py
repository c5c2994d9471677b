"""The set of op implementations the model calls, loaded from a kernels folder.

`KernelSet.load(dir)` loads every kernel file of the folder (each `<dir>/<op>.py`; the ops the model
always needs, `OPS`, must be there) and binds the implementation for the device: `cpu` on CPU. The
model only ever calls `kernels.<op>(...)`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from slotserver.module_loader import LoadedModule, default_dir, load_by_path

OPS = ("rms_norm", "rope", "attention", "silu_mul")
KERNEL_CONTRACT = ("OP", "reference", "cpu", "example_inputs", "TOL")


@dataclass
class KernelSet:
    modules: dict[str, LoadedModule] = field(default_factory=dict)
    impl: str = "cpu"

    @classmethod
    def load(cls, folder: Path | None = None, impl: str = "cpu") -> "KernelSet":
        folder = Path(folder) if folder is not None else default_dir("kernels")
        names = set(OPS) | {p.stem for p in folder.glob("*.py") if not p.stem.startswith("_")}
        mods = {op: load_by_path(folder / f"{op}.py", KERNEL_CONTRACT) for op in sorted(names)}
        return cls(mods, impl)

    def fn(self, op: str) -> Callable:
        return getattr(self.modules[op].module, self.impl)

    def __getattr__(self, op: str) -> Callable:
        modules = self.__dict__.get("modules", {})
        if op in modules:
            return self.fn(op)
        raise AttributeError(f"no kernel '{op}' loaded")

    def versions(self) -> dict[str, str]:
        return {op: m.version for op, m in self.modules.items()}
