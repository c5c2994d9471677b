"""What a step graph's capture sees (step_graph.py): the C calls a step makes, and its torch calls.

`Recorder` wraps every declared function of the loaded native libraries while watching and
records this thread's calls with their arguments; one not declared `replay=True` refuses the step.
`AllocOnly` sees every torch call of the step: it keeps what the step allocates (`fresh`, and
`zeroed` for zeros a replay must zero again) and every view; any other result (a computation) or a
read of a tensor's value into Python refuses the step, since a replay runs only the C calls.
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Callable

import torch
from torch.overrides import TorchFunctionMode

_ALLOC = frozenset({"empty", "empty_like", "new_empty"})
_ZEROS = frozenset({"zeros", "zeros_like", "new_zeros"})   # allocations a replay zeroes again
_READS = frozenset({"item", "tolist", "numpy", "__int__", "__index__", "__float__", "__bool__", "__setitem__"})


class Recorder:
    """Wraps every declared function of the loaded libraries while watching; records this thread's calls."""

    def __init__(self) -> None:
        self.thread = threading.get_ident()
        self.calls: list[tuple[Callable, tuple]] = []
        self.refused = ""

    def watching(self, libraries: list[ctypes.CDLL]) -> "_Watching":
        return _Watching(self, libraries)

    def call(self, fn: Callable, args: tuple):
        rc = fn(*args)
        if threading.get_ident() == self.thread:
            self.calls.append((fn, args))
            if not getattr(fn, "replay", False):
                self.refused = f"{fn.__name__} is not declared replayable"
        return rc


class _Watching:
    def __init__(self, recorder: Recorder, libraries: list[ctypes.CDLL]) -> None:
        self.recorder, self.libraries, self.patched = recorder, libraries, []

    def __enter__(self) -> None:
        for lib in self.libraries:
            for name, fn in list(vars(lib).items()):
                if isinstance(fn, ctypes._CFuncPtr):
                    setattr(lib, name, _Watched(self.recorder, fn))
                    self.patched.append((lib, name, fn))

    def __exit__(self, *exc) -> None:
        for lib, name, fn in self.patched:
            setattr(lib, name, fn)


class _Watched:
    __slots__ = ("recorder", "fn")

    def __init__(self, recorder: Recorder, fn: Callable) -> None:
        self.recorder, self.fn = recorder, fn

    def __call__(self, *args):
        return self.recorder.call(self.fn, args)


class AllocOnly(TorchFunctionMode):
    """Sees every torch call of the body: keeps what it allocates (`fresh`) and every view; any
    other result (a computation) or a read of a value into Python sets `refused`."""

    def __init__(self) -> None:
        super().__init__()
        self.fresh: list[torch.Tensor] = []
        self.zeroed: list[torch.Tensor] = []
        self.keep: list[torch.Tensor] = []
        self.refused = ""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        name = getattr(func, "__name__", "")
        if (name in _ALLOC or name in _ZEROS) and isinstance(out, torch.Tensor):
            self.fresh.append(out)
            self.keep.append(out)
            if name in _ZEROS:
                self.zeroed.append(out)
        elif name in _READS or "out" in kwargs or (name.endswith("_") and not name.endswith("__")):
            self.refused = self.refused or name
        else:
            for t in out if isinstance(out, (tuple, list)) else (out,):
                if isinstance(t, torch.Tensor):
                    if not _views_an_argument(t, args):
                        self.refused = self.refused or name
                    self.keep.append(t)
        return out


def _views_an_argument(t: torch.Tensor, args) -> bool:
    ptr = t.untyped_storage().data_ptr()
    return any(isinstance(a, torch.Tensor) and a.untyped_storage().data_ptr() == ptr for a in args)
