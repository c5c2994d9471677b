"""Load `kernels/*.py` and `layouts/*.py` by path into fresh module objects.

Why by path and fresh: the lab reloads edited files while serving, and a live `@triton.jit`
function must never be patched in place. Each load gets a unique module name, so an old version
keeps working for whoever still holds it until the engine swaps at a step boundary.

A kernel's C may sit in a `.c` file beside it, named in the module as
`native.c_source(__file__, "name.c")` (one file may serve several modules: attention.c is both
attention's and paged_attention's). Such a file is part of the module's `Source`: read with the
`.py`, in the version, and what the module compiles during `load_source` is those bytes (not the
file again), so what was validated is what is swapped in, as for the `.py` itself. A kernel's
Triton code may likewise sit in parts, `_<name>.py` files beside it that it loads with
`kernel_parts.load(__file__, "_name.py")` (runtime/kernel_parts.py): read with it, in its version,
executed from those bytes; a part may name further parts and `.c` files.
"""

from __future__ import annotations

import functools
import hashlib
import linecache
import os
import itertools
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from types import CodeType, ModuleType

from slotserver.runtime import c_sources, kernel_parts, lazy_triton, triton_interpreter
from slotserver.errors import ModuleLoadError, line_of  # noqa: F401  re-export: defined without torch in slotserver.errors

_counter = itertools.count()
REPO_ROOT = Path(__file__).resolve().parents[2]
NAME_RE = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,63}")
C_REF = re.compile(r"""native\.c_source\(\s*__file__\s*,\s*["']([A-Za-z][A-Za-z0-9_]{0,63}\.c)["']\s*\)""")


@dataclass(frozen=True)
class LoadedModule:
    path: Path
    module: ModuleType
    version: str  # first 12 hex digits of the sha256 of the file (and of the C files and parts it names)
    c_files: tuple[str, ...] = ()   # the `.c` files beside it that it compiles
    parts: tuple[str, ...] = ()     # the `_<name>.py` parts beside it that it loads


def file_version(path: Path) -> str:
    """The version shown for kernels and layouts: `read_source(path).version`."""
    return read_source(path).version


def default_dir(kind: str) -> Path:
    """The bundled `kernels/` or `layouts/` folder: a source checkout's own (edited in place), else
    the copy an installed wheel carries inside the package (slotserver/bundled/)."""
    checkout = REPO_ROOT / kind
    if (REPO_ROOT / "pyproject.toml").is_file() and checkout.is_dir():   # a source checkout
        return checkout
    return Path(__file__).resolve().parents[1] / "bundled" / kind


def module_names(folder: Path) -> list[str]:
    """The names the lab lists from `folder`: `<identifier>.py` files that resolve inside it.

    This list is the whole of what a request may name: nothing else is ever imported, so a
    name like `/tmp/x/evil`, `../x`, `a/b` or a symlink pointing out of the folder never runs.
    """
    root = Path(folder).resolve()
    names = []
    for p in sorted(Path(folder).glob("*.py")):
        if NAME_RE.fullmatch(p.stem) and p.resolve().parent == root and p.resolve().is_file():
            names.append(p.stem)
    return names


def resolve_in_folder(folder: Path, name: object, kind: str) -> Path:
    """`folder/<name>.py` for a name `module_names(folder)` lists; ModuleLoadError otherwise.

    Why both checks: the name must be a plain identifier (`fullmatch`, so no separators, dots or
    a trailing newline), and the resolved file must still lie inside the resolved folder (a
    symlink in the folder that points elsewhere is refused too).
    """
    if not isinstance(name, str) or not NAME_RE.fullmatch(name) or not _listed(Path(folder), name):
        shown = name if isinstance(name, str) else type(name).__name__
        raise ModuleLoadError(f"unknown {kind} {shown[:100]!r} (known: {', '.join(module_names(folder)) or 'none'})")
    return Path(folder) / f"{name}.py"


def _listed(folder: Path, name: str) -> bool:
    """Whether `module_names(folder)` lists `name` (an identifier), resolving its one file: calling
    `module_names` for each name resolved every file of the folder again (~45 ms of a model's kernel
    load, 16 names); the folder's plain listing here only checks the name's exact spelling."""
    path = folder / f"{name}.py"
    try:   # listed under this exact name (a case-insensitive filesystem would also open `Paged.py`)
        return path.name in os.listdir(folder) and path.resolve().parent == folder.resolve() and path.resolve().is_file()
    except (OSError, RuntimeError):   # a symlink loop: not a module
        return False


def locate(path: str | Path, folders: dict[str, Path]) -> tuple[str, str] | None:
    """(kind, name) when `path` names a file that `module_names` lists in one of `folders`."""
    try:
        p = Path(path)
        for kind, folder in folders.items():
            if p.suffix == ".py" and p.parent.resolve() == Path(folder).resolve() and p.stem in module_names(folder):
                return kind, p.stem
    except (OSError, ValueError, RuntimeError):  # a NUL byte, a symlink loop: not a listed module
        return None
    return None


@dataclass(frozen=True)
class Source:
    """The bytes of a kernel or layout file, read once: what is validated is what is swapped in."""
    path: Path
    data: bytes
    version: str  # first 12 hex digits of the sha256 of `data`, `c_files` and `parts`
    c_files: dict[str, bytes] = field(default_factory=dict)   # name -> bytes of each `.c` it names
    parts: dict[str, bytes] = field(default_factory=dict)     # name -> bytes of each part it loads

    def files(self) -> list[str]:
        """The names of every file beside the module that is part of it."""
        return sorted(self.c_files) + sorted(self.parts)


def read_source(path: Path) -> Source:
    """The file's bytes and those of every part (`kernel_parts.PART_REF`) and `.c` file (`C_REF`) it
    names, or its parts name, from its own folder."""
    path = Path(path)
    data = read_beside(path, path)
    parts: dict[str, bytes] = {}
    todo = _refs(kernel_parts.PART_REF, data)
    while todo:
        name = todo.pop()
        if name not in parts:
            parts[name] = read_beside(path.parent / name, path)
            todo += _refs(kernel_parts.PART_REF, parts[name])
    names = sorted({n for text in (data, *parts.values()) for n in _refs(C_REF, text)})
    c_files = {n: read_beside(path.parent / n, path) for n in names}
    digest = hashlib.sha256(data)
    for name, c in c_files.items():   # as before parts existed: a module without parts keeps its version
        digest.update(b"\0" + name.encode() + b"\0" + c)
    for name, blob in sorted(parts.items()):
        digest.update(b"\0part\0" + name.encode() + b"\0" + blob)
    return Source(path, data, digest.hexdigest()[:12], c_files, dict(sorted(parts.items())))


def _refs(pattern: re.Pattern, data: bytes) -> list[str]:
    return pattern.findall(data.decode("utf-8", errors="replace"))


def read_beside(path: Path, module: Path) -> bytes:
    """Bytes of `path`, a regular file inside `module`'s folder (a symlink out is refused)."""
    try:
        if path != module and path.resolve().parent != module.resolve().parent:
            raise ModuleLoadError(f"{module}: {path.name} resolves outside {module.parent}")
        return path.read_bytes()
    except OSError as e:
        raise ModuleLoadError(f"{module}: cannot read {path.name} ({e.strerror})") from None


def users_of(folder: Path, file_name: str) -> list[str]:
    """The modules `module_names(folder)` lists whose source names `file_name` (a `.c` file or a
    part, directly or through a part): a saved one reloads them."""
    out = []
    for name in module_names(folder):
        try:
            if file_name in read_source(Path(folder) / f"{name}.py").files():
                out.append(name)
        except ModuleLoadError:
            continue
    return out


def lab_files(folder: Path) -> list[Path]:
    """Every file of a lab folder: the modules it lists and the `.c` files and parts they name."""
    out: list[Path] = []
    for name in module_names(folder):
        py = Path(folder) / f"{name}.py"
        out += [py] + [py.parent / f for f in read_source(py).files()]
    return sorted(set(out))


def load_source(src: Source, required: tuple[str, ...]) -> LoadedModule:
    """Execute `src`'s bytes as a new module (never re-reading the file); check `required` names.

    The bytes also go into `linecache` under the file's name, so tracebacks and whatever reads a
    function's source (triton's `@jit`, `inspect`) see these bytes even if the file changed since.
    """
    path = src.path
    with c_sources.given(path.parent, src.c_files), kernel_parts.given(path.parent, src.parts):
        module = execute(path, src.data, "dyn")
    missing = [r for r in required if not hasattr(module, r)]
    if missing:
        raise ModuleLoadError(f"{path}: missing contract name(s): {', '.join(missing)}")
    return LoadedModule(path, module, src.version, tuple(src.c_files), tuple(src.parts))


def execute(path: Path, data: bytes, kind: str) -> ModuleType:
    """`data` run as a new module (`_slotserver_<kind>_<stem>_<n>`) under triton stand-ins, with
    `path` as its file; a failure is a ModuleLoadError naming path:line (or the part's, from a part
    it loads). What `load_source` runs for a module and `kernel_parts.load` for each of its parts."""
    name = f"_slotserver_{kind}_{path.stem.lstrip('_')}_{next(_counter)}"
    module = ModuleType(name)
    module.__file__ = str(path)
    text = data.decode("utf-8", errors="replace")
    linecache.cache[str(path)] = (len(text), None, text.splitlines(True), str(path))
    try:
        code = _compiled(data, str(path))
        sys.modules[name] = module  # dataclasses and triton look modules up by name
        with lazy_triton.stand_ins(module.__dict__):
            exec(code, module.__dict__)  # noqa: S102 - a listed kernel/layout file or its part: the lab's purpose
    except SyntaxError as e:
        raise ModuleLoadError(f"{path}:{e.lineno}: syntax error: {e.msg}") from None
    except ModuleLoadError:   # a part's: it names the part's file and line
        raise
    except Exception as e:  # noqa: BLE001 - any import-time failure is reported, not raised
        raise ModuleLoadError(f"{path}:{line_of(e, path)}: import failed: {type(e).__name__}: {e}") from None
    finally:
        sys.modules.pop(name, None)
    triton_interpreter.install()   # triton imported eagerly (or earlier) and interpreted: its faster helper calls
    return module


@functools.lru_cache(maxsize=256)
def _compiled(data: bytes, path: str) -> CodeType:
    """`data` compiled as `path`'s module, once per process for the same bytes: every model load
    executes each kernel file and part afresh (a new module: see the module docstring), and
    compiling their ~40 sources again was most of a small model's load (80 of 180 ms). A code
    object is immutable, so running it again in a new module's namespace is what compiling anew
    would give; a SyntaxError is raised each time (not cached)."""
    return compile(data, path, "exec", dont_inherit=True)


def load_by_path(path: Path, required: tuple[str, ...]) -> LoadedModule:
    """Read `path` once and execute it as a new module (`load_source`)."""
    return load_source(read_source(path), required)

