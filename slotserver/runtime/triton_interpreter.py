"""Triton's interpreter (TRITON_INTERPRET=1) without its repeated patching of `triton.language`.

Where the interpreter spends a third of its time: each launch patches `tl`'s builtins for the
interpreter (triton/runtime/interpreter.py `_patch_lang`, an `inspect.getmembers` walk of `tl`,
`tl.tensor` and `tl.math`) and restores them when the grid is done, which is right; but every call
of a `@triton.jit` function from inside the kernel (`InterpretedFunction.__call__`: triton's own
`tl.sum`, `tl.max`, `tl.zeros`, `tl.cdiv`..., and our helpers such as `_q32_step`) patches the
modules its globals see again, in every program of the grid, and never restores them. Within one
launch the second such patch of the same modules changes nothing but the time (measured, triton
3.9, one core: the split-decode attention checks 9.8 -> 6.5 s, `_patch_lang` calls 3235 -> 38).

`install()` wraps both calls: a launch records which modules are patched (its own, then those its
calls patched), and a call inside it patches only when its globals see a module not yet patched
(the first `tl.sum` patches `triton.language.core`, as before). What is patched and restored, and
what the kernels compute, is unchanged. If triton's interpreter no longer has these names,
install() leaves it as it is (slower, not wrong). Only ever installed under TRITON_INTERPRET=1
(gpu_info.interpreted's test; torch-free here, as the loader is), by the kernel loader.
"""

from __future__ import annotations

import os
import sys
import threading

_state = threading.local()   # .langs: ids of the modules the running launch patched (the interpreter runs one grid a thread)
_installed = False


def install() -> bool:
    """Under TRITON_INTERPRET=1 with triton imported: wrap the interpreter once. -> whether it is wrapped."""
    global _installed
    if _installed or os.environ.get("TRITON_INTERPRET", "0") in ("", "0") or "triton.runtime.interpreter" not in sys.modules:
        return _installed
    interp = sys.modules["triton.runtime.interpreter"]
    try:
        grid_call, nested, error = interp.GridExecutor.__call__, interp.InterpretedFunction.__call__, interp.InterpreterError
        tl, core = interp.tl, interp.tl.core
    except AttributeError:
        return False

    def lang_ids(fn) -> frozenset[int]:
        return frozenset(id(v) for v in fn.__globals__.values() if v is tl or v is core)

    def grid_call_once(self, *args, **kwargs):
        outer = getattr(_state, "langs", None)
        _state.langs = lang_ids(self.fn)
        try:
            return grid_call(self, *args, **kwargs)
        finally:
            _state.langs = outer

    def helper_call(self, *args, **kwargs):
        """The interpreter's own helper call (triton 3.9) less its `_patch_lang`, where the launch made it."""
        patched, langs = getattr(_state, "langs", None), lang_ids(self.fn)
        if patched is None or not langs <= patched:
            if patched is not None:
                _state.langs = patched | langs   # patched by this call (for the rest of the launch)
            return nested(self, *args, **kwargs)
        fn = self.rewrite()
        try:
            return fn(*args, **kwargs)
        except Exception as e:
            raise error(repr(e)) from e

    interp.GridExecutor.__call__, interp.InterpretedFunction.__call__ = grid_call_once, helper_call
    _installed = True
    return True
