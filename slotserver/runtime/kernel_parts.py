"""Parts of a kernel module: `_<name>.py` files beside it, loaded with `kernel_parts.load(__file__, "_x.py")`.

Why: an op is one module under the kernel contract (reference, cpu, triton, example inputs,
tolerance), validated, versioned and swapped as one, but its Triton code may be several concepts
(qmatmul_gpu's per-slice kernel, its wide dp4a GEMV, its int8 tensor-core product), each worth a
file of its own. A part is such a file. Its leading `_` keeps it out of `loader.module_names`, so
no request can name it as an op or a layout; it runs only as a part of a module that names it.

A part is read with its module, like the `.c` files a module names (`loader.read_source`: in its
`Source` and its version), and while the loader executes the module, `load` answers from those
bytes (`given`), never from the file again: what was validated is what is swapped in, and a part
saved mid-validation cannot slip in. The lab reloads every serving module that names a saved part.
Outside the lab (a plain import, a test) `load` reads the file beside the module.

Each load of a module executes its parts afresh, as new module objects (an old version's kernels
keep their own parts); within one load a part named twice (by the module and by another part) is
one object. A part is executed under the module's triton stand-ins (`lazy_triton`), so its
`@triton.jit` helpers become real with the module's kernels and may be called from them.
"""

from __future__ import annotations

import contextlib
import contextvars
import re
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

from slotserver.errors import ModuleLoadError

PART_NAME = re.compile(r"_[A-Za-z][A-Za-z0-9_]{0,62}\.py")
PART_REF = re.compile(r"""kernel_parts\.load\(\s*__file__\s*,\s*["'](_[A-Za-z][A-Za-z0-9_]{0,62}\.py)["']\s*\)""")


@dataclass
class _Load:
    """One module load's part bytes (`given`; None: read the files) and the parts executed so far."""
    texts: dict[Path, bytes] | None
    loaded: dict[Path, ModuleType] = field(default_factory=dict)


_LOAD: contextvars.ContextVar[_Load | None] = contextvars.ContextVar("kernel_parts", default=None)


@contextlib.contextmanager
def given(folder: Path, files: dict[str, bytes]):
    """While the block runs, `load(<folder>/x.py, name)` executes `files[name]`."""
    token = _LOAD.set(_Load({(Path(folder) / name).resolve(): data for name, data in files.items()}))
    try:
        yield
    finally:
        _LOAD.reset(token)


def load(origin: str, name: str) -> ModuleType:
    """The part `name` beside the module file `origin`, executed as a new module (once per load)."""
    if not PART_NAME.fullmatch(name):
        raise ModuleLoadError(f"{origin}: {name!r} is not a part name (_<identifier>.py)")
    path = (Path(origin).parent / name).resolve()
    state = _LOAD.get()
    token = _LOAD.set(state := _Load(None)) if state is None else None
    try:
        if path not in state.loaded:
            if state.texts is not None and path not in state.texts:   # not read with the module: never run unread bytes
                raise ModuleLoadError(f"{origin}: loads part {name}, which was not read with it: name a part as "
                                      f"`kernel_parts.load(__file__, \"{name}\")`, a literal, so that it is validated too")
            from slotserver.runtime import loader   # it imports this module: at call time
            data = state.texts[path] if state.texts is not None else loader.read_beside(path, Path(origin))
            state.loaded[path] = loader.execute(Path(origin).parent / name, data, "part")
        return state.loaded[path]
    finally:
        if token is not None:
            _LOAD.reset(token)

