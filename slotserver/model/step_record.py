"""What a step graph's capture sees (step_graph.py): the C calls a step makes, and its torch calls.

`Recorder` records the calls this thread makes through the native libraries' functions while
watching (`native.recording`); one not declared `replay=True` refuses the step. It swaps nothing
into the shared libraries: the lab loads kernels on another thread meanwhile, and must see them
as declared (see `native.Function`).
`AllocOnly` sees every torch call of the step: it keeps what the step allocates (`fresh`, and
`zeroed` for zeros a replay must zero again) and every view; any other result (a computation) or a
read of a tensor's value into Python refuses the step, since a replay runs only the C calls.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import torch
from torch.overrides import TorchFunctionMode

from slotserver.runtime import native

_ALLOC = frozenset({"empty", "empty_like", "new_empty"})
_ZEROS = frozenset({"zeros", "zeros_like", "new_zeros"})   # allocations a replay zeroes again
_READS = frozenset({"item", "tolist", "numpy", "__int__", "__index__", "__float__", "__bool__", "__setitem__"})


class Recorder:
    """Records the native calls this thread makes while `watching`, in order, with their arguments."""

    def __init__(self) -> None:
        self.calls: list[tuple[Callable, tuple]] = []
        self.refused = ""

    def watching(self) -> contextlib.AbstractContextManager:
        return native.recording(self.call)

    def call(self, fn: Callable, replay: bool, args: tuple):
        rc = fn(*args)
        self.calls.append((fn, args))
        if not replay:
            self.refused = self.refused or f"{fn.__name__} is not declared replayable"
        return rc


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
    """Whether `t` shares storage with a tensor argument. An opaque tensor (an mkldnn-packed weight,
    the AMX path's `packed`) has no storage to compare: it is never a view (and before this check
    knew that, capturing such a step raised out of the engine: issue 32)."""
    ptr = _storage_ptr(t)
    return ptr is not None and any(isinstance(a, torch.Tensor) and _storage_ptr(a) == ptr for a in args)


def _storage_ptr(t: torch.Tensor) -> int | None:
    try:
        return t.untyped_storage().data_ptr()
    except (NotImplementedError, RuntimeError):
        return None
