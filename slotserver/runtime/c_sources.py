"""The C files a kernel module compiles, as the lab read them.

A kernel module asks for its C with `native.c_source(__file__, "attention.c")`. Outside the lab
(a plain import, a test) that reads the file beside the module. While the loader executes a
module (`loader.load_source`), the bytes it read with the module's `.py` (its `Source`) are
`given` here first, and `read` answers from them: a `.c` saved between the validation of an edit
and its swap can never slip in unvalidated, and the validator's child and the engine compile the
same bytes. A context variable, not a global: the lab's worker thread and a test thread may load
modules at once.
"""

from __future__ import annotations

import contextlib
import contextvars
from pathlib import Path

_GIVEN: contextvars.ContextVar[dict[Path, str] | None] = contextvars.ContextVar("c_sources", default=None)


@contextlib.contextmanager
def given(folder: Path, files: dict[str, bytes]):
    """While the block runs, `read(<folder>/x.py, name)` answers `files[name]`."""
    texts = {(Path(folder) / name).resolve(): data.decode("utf-8", errors="replace") for name, data in files.items()}
    token = _GIVEN.set(texts)
    try:
        yield
    finally:
        _GIVEN.reset(token)


def read(origin: str, name: str) -> str:
    """The text of the C file `name` beside the module file `origin`."""
    path = (Path(origin).parent / name).resolve()
    texts = _GIVEN.get()
    if texts is not None and path in texts:
        return texts[path]
    return path.read_text()
