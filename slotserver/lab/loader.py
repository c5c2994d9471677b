"""Load `kernels/*.py` and `layouts/*.py` by path into fresh module objects.

Why by path and fresh: the lab reloads edited files while serving, and a live `@triton.jit`
function must never be patched in place. Each load gets a unique module name, so an old version
keeps working for whoever still holds it until the engine swaps at a step boundary.
"""

from __future__ import annotations

import hashlib
import linecache
import itertools
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from slotserver.lab import lazy_triton
from slotserver.errors import ModuleLoadError  # noqa: F401  re-export: defined without torch in slotserver.errors

_counter = itertools.count()
REPO_ROOT = Path(__file__).resolve().parents[2]
NAME_RE = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,63}")


@dataclass(frozen=True)
class LoadedModule:
    path: Path
    module: ModuleType
    version: str  # first 12 hex digits of the file's sha256


def file_version(path: Path) -> str:
    """First 12 hex digits of the file's sha256: the version shown for kernels and layouts."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()[:12]


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
    known = module_names(folder)
    if not isinstance(name, str) or not NAME_RE.fullmatch(name) or name not in known:
        shown = name if isinstance(name, str) else type(name).__name__
        raise ModuleLoadError(f"unknown {kind} {shown[:100]!r} (known: {', '.join(known) or 'none'})")
    return Path(folder) / f"{name}.py"


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
    version: str  # first 12 hex digits of the bytes' sha256


def read_source(path: Path) -> Source:
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as e:
        raise ModuleLoadError(f"{path}: cannot read ({e.strerror})") from None
    return Source(path, data, hashlib.sha256(data).hexdigest()[:12])


def load_source(src: Source, required: tuple[str, ...]) -> LoadedModule:
    """Execute `src`'s bytes as a new module (never re-reading the file); check `required` names.

    The bytes also go into `linecache` under the file's name, so tracebacks and whatever reads a
    function's source (triton's `@jit`, `inspect`) see these bytes even if the file changed since.
    """
    path = src.path
    name = f"_slotserver_dyn_{path.stem}_{next(_counter)}"
    module = ModuleType(name)
    module.__file__ = str(path)
    text = src.data.decode("utf-8", errors="replace")
    linecache.cache[str(path)] = (len(text), None, text.splitlines(True), str(path))
    try:
        code = compile(src.data, str(path), "exec", dont_inherit=True)
        sys.modules[name] = module  # dataclasses and triton look modules up by name
        with lazy_triton.stand_ins(module.__dict__):   # triton imported on first use, not here
            exec(code, module.__dict__)  # noqa: S102 - a listed kernel/layout file: the lab's purpose
    except SyntaxError as e:
        raise ModuleLoadError(f"{path}:{e.lineno}: syntax error: {e.msg}") from None
    except Exception as e:  # noqa: BLE001 - any import-time failure is reported, not raised
        raise ModuleLoadError(f"{path}:{line_of(e, path)}: import failed: {type(e).__name__}: {e}") from None
    finally:
        sys.modules.pop(name, None)
    missing = [r for r in required if not hasattr(module, r)]
    if missing:
        raise ModuleLoadError(f"{path}: missing contract name(s): {', '.join(missing)}")
    return LoadedModule(path, module, src.version)


def load_by_path(path: Path, required: tuple[str, ...]) -> LoadedModule:
    """Read `path` once and execute it as a new module (`load_source`)."""
    return load_source(read_source(path), required)


def line_of(exc: BaseException, path: Path) -> int | str:
    """The line in `path` where `exc` was raised (innermost frame in that file), or '?'."""
    tb, line = exc.__traceback__, "?"
    while tb is not None:
        if Path(tb.tb_frame.f_code.co_filename) == path:
            line = tb.tb_lineno
        tb = tb.tb_next
    return line
