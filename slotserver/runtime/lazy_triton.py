"""Kernel files import triton at their top without paying for it until a Triton kernel is used.

Every kernel file starts with `import triton` / `import triton.language as tl` and decorates its
Triton kernel with `@triton.jit`. Serving on CPU never launches one, yet importing triton cost
~71 MiB of a ~490 MiB RSS when healthy and ~0.2 s (measured after torch, which is needed anyway).
So `load_source` runs a kernel file with stand-ins for those two modules (`stand_ins`, only while
triton is not imported yet): `@triton.jit` records the function, and the first use of anything
Triton (launching a kernel, any other `triton.*` or `tl.*` attribute, the AOT compiler via
`resolve`) imports the real triton and puts the real objects into that module's globals: the
`triton` / `tl` names and every recorded kernel become what an eager import would have made, so
Triton's compiler and interpreter (TRITON_INTERPRET=1) see plain modules and JIT functions.
Nothing else sees the stand-ins: they leave `sys.modules` as soon as the file has run. A kernel's
parts (runtime/kernel_parts.py) run while their module runs: they share its stand-ins and its
recorded kernels, and its first use of Triton makes theirs real too (`_Owner.namespaces`).
"""

from __future__ import annotations

import contextlib
import importlib
import sys
import threading
from collections.abc import Iterator
from types import ModuleType

from slotserver.runtime import triton_interpreter

_lock = threading.Lock()


class LazyJIT:
    """`@triton.jit` on a stand-in: the function and the decorator's arguments, made real on first use."""

    def __init__(self, fn, kwargs: dict, owner: "_Owner") -> None:
        self.fn, self.kwargs, self.owner = fn, kwargs, owner
        owner.pending.append(self)
        self.__name__ = getattr(fn, "__name__", "kernel")
        self.__doc__ = getattr(fn, "__doc__", None)

    def real(self):
        kernels = self.owner.materialize()
        if id(self) not in kernels:   # recorded after the import (`from triton import jit` kept past it)
            with _lock:
                kernels[id(self)] = self.made_by(importlib.import_module("triton"))
        return kernels[id(self)]

    def made_by(self, triton: ModuleType):
        return triton.jit(self.fn, **self.kwargs)

    def __getitem__(self, grid):
        return self.real()[grid]

    def __getattr__(self, name: str):
        return getattr(self.real(), name)

    def __call__(self, *args, **kwargs):
        return self.real()(*args, **kwargs)


class _StandIn(ModuleType):
    """`triton` or `triton.language` before the real import: any attribute imports (the owner gives
    the `triton` stand-in its recording `jit`)."""

    def __init__(self, name: str, owner: "_Owner") -> None:
        super().__init__(name)
        self._owner = owner

    def _real(self) -> ModuleType:
        self._owner.materialize()
        return sys.modules[self.__name__]

    def __getattr__(self, name: str):
        if name.startswith("__") and name.endswith("__"):   # import machinery probing: no import here
            raise AttributeError(name)
        return getattr(self._real(), name)


class _Owner:
    """One kernel module's stand-ins and recorded kernels."""

    def __init__(self, namespace: dict) -> None:
        self.namespaces = [namespace]   # the module's globals, then its parts'
        self.triton = _StandIn("triton", self)
        self.language = _StandIn("triton.language", self)
        self.triton.language = self.language   # `import triton.language as tl` binds this attribute
        self.triton.jit = self.jit
        self.kernels: dict[int, object] | None = None
        self.pending: list[LazyJIT] = []

    def jit(self, fn=None, **kwargs):
        """`@triton.jit` and `@triton.jit(...)`: the kernel recorded (LazyJIT)."""
        return (lambda f: LazyJIT(f, kwargs, self)) if fn is None else LazyJIT(fn, kwargs, self)

    def materialize(self) -> dict[int, object]:
        """Import triton, make every recorded kernel real, patch the module's globals; -> id -> real."""
        with _lock:
            if self.kernels is not None:
                return self.kernels
            for name, stand_in in (("triton.language", self.language), ("triton", self.triton)):
                if sys.modules.get(name) is stand_in:
                    del sys.modules[name]
            triton = importlib.import_module("triton")
            language = importlib.import_module("triton.language")
            triton_interpreter.install()   # a no-op unless TRITON_INTERPRET=1
            kernels = {id(lazy): lazy.made_by(triton) for lazy in self.pending}
            real = {id(self.triton): triton, id(self.language): language, **kernels}
            for namespace in self.namespaces:
                for key, value in list(namespace.items()):
                    if id(value) in real:
                        namespace[key] = real[id(value)]
            self.kernels = kernels
            return kernels


@contextlib.contextmanager
def stand_ins(namespace: dict) -> Iterator[None]:
    """While a kernel file runs in `namespace`: stand-ins for triton where it is not imported yet
    (a part run inside its module's file joins the module's)."""
    current = sys.modules.get("triton")
    if isinstance(current, _StandIn):
        with _lock:
            current._owner.namespaces.append(namespace)
        yield
        return
    if "triton" in sys.modules:
        yield
        return
    owner = _Owner(namespace)
    sys.modules["triton"], sys.modules["triton.language"] = owner.triton, owner.language
    try:
        yield
    finally:
        for name, stand_in in (("triton.language", owner.language), ("triton", owner.triton)):
            if sys.modules.get(name) is stand_in:
                del sys.modules[name]


def resolve(fn):
    """The real Triton kernel behind `fn` (a recorded one is made real first); anything else as is."""
    return fn.real() if isinstance(fn, LazyJIT) else fn
