"""Hand-written C kernels for the CPU path: compiled on first use, cached, loaded with ctypes.

Why C, and why this way: at decode, a CPU step is a few hundred tiny ops, and for some of them
(decode attention: one query row per head against a few hundred cached keys) torch's kernels pay
far more in per-call setup than in arithmetic. A kernel module may carry its own C source and ask
`build(name, source)` for a library:

- `PRELUDE` (prelude.h beside this file: bf16 conversions, a vectorizable exp, row loads, AVX-512
  helpers) is prepended; the source is compiled with the system C compiler (`$CC`, else `cc`):
  `-O3`, the target flags of the CPU variant (`slotserver.runtime.cpu_features`: `-march=native`, or
  `-march=x86-64-v3` under `SLOTSERVER_CPU=avx2`, AMX taken out under `avx512`), float
  reassociation (not `-ffast-math`, see FLAGS) and `-fopenmp`, into `$SLOTSERVER_CACHE` (default
  `~/.cache/slotserver/native`), named by a hash of the source, the flags and this CPU's feature
  flags; a second process (or a second test worker) reuses it. About half a second per kernel; no
  torch headers, no Python headers. The C must compile for every variant: AVX-512 code sits under
  `#ifdef SLOT_AVX512` (or `__AVX512F__`) with a scalar loop beside it.
- `-fopenmp` links `libgomp.so.1`, which torch has already loaded: the kernel's parallel loops run
  on the calling thread's OpenMP team, the same threads torch's own ops use (no second pool
  fighting for the cores). Callers pass `torch.get_num_threads()` explicitly.
- no compiler (or `SLOTSERVER_NATIVE=0`): `build` returns None and the kernel module keeps its
  torch formulation; nothing depends on a compiler being present. A compile error in a kernel
  module's source raises (`strict`), with the compiler's messages pointing at its `.c` file's own
  lines (`#line`): the lab refuses such an edit instead of silently serving the torch form.
  `SLOTSERVER_NATIVE=0` turns every native kernel off (for A/B measurements, or to rule them out).

Only plain C types cross the boundary (pointers as integers, int64 strides, floats); ctypes
releases the GIL for the duration of the call.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import logging
import os
import re
import platform
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path

import torch  # noqa: F401 - loads torch's libgomp first, so the kernels share its OpenMP runtime

from slotserver.runtime import c_sources, cpu_features

log = logging.getLogger("slotserver.runtime.native")

# Not -ffast-math: with it, GCC links crtfastmath.o into the library, whose constructor turns on
# flush-to-zero for the whole process (every later float op of torch and Python would change).
# These flags alone let the compiler vectorize float reductions. The target flags come from the
# CPU variant (`compile_flags`).
FLAGS = ("-O3", "-fno-math-errno", "-fno-trapping-math", "-fno-signed-zeros", "-fassociative-math",
         "-freciprocal-math", "-fopenmp", "-fPIC", "-shared")
_loaded: dict[str, ctypes.CDLL | None] = {}
_unavailable: set[str] = set()   # libraries that could not be built in this process (unavailable())

# Prepended to every source (prelude.h beside this file, read at import): bf16 <-> float32, a
# vectorizable exp, row loads and prefetches, the AVX-512 forms of loads, stores and exp.
# A tensor's dtype crosses the boundary as an int flag: 1 for bfloat16, 0 for float32.
_PRELUDE_FILE = Path(__file__).with_name("prelude.h")
PRELUDE = _PRELUDE_FILE.read_text()


class NativeError(RuntimeError):
    """The C source did not compile (the message carries the compiler's output)."""


class NoCompiler(NativeError):
    """No C compiler on this machine: the kernels' torch formulations serve."""


def cache_dir() -> Path:
    return Path(os.environ.get("SLOTSERVER_CACHE") or Path.home() / ".cache" / "slotserver") / "native"


def compiler() -> str | None:
    cc = os.environ.get("CC") or "cc"
    return shutil.which(cc)


def off_by_request() -> bool:
    """`SLOTSERVER_NATIVE=0`: the torch formulations serve (A/B measurements, or to rule C out)."""
    return os.environ.get("SLOTSERVER_NATIVE", "1") == "0"


def enabled() -> bool:
    """Whether the C kernels serve here: a compiler, and not `SLOTSERVER_NATIVE=0`."""
    return not off_by_request() and compiler() is not None


def unavailable() -> list[str]:
    """Names of the libraries that could not be built in this process, whose torch formulations serve
    instead (a machine's fault: an unwritable cache folder, a broken compiler; `build` logged each).
    Why callers ask: `enabled()` says only that C *can* serve; the engine's thread tuner may switch
    thread counts only where every op it runs is C, whose floats do not follow the thread count."""
    return sorted(_unavailable)


def compile_flags() -> tuple[str, ...]:
    """FLAGS and the target flags of this process's CPU variant (SLOTSERVER_CPU, see cpu_features)."""
    return (*FLAGS, *cpu_features.current().march_flags())


def _cpu_key() -> str:
    """The CPU's feature flags (an `-march=native` library is only valid on a CPU like this one)."""
    flags = cpu_features.host_flags()
    return " ".join(sorted(flags)) if flags else (platform.processor() or platform.machine())


# Compiled first with the same flags: if this fails (no OpenMP, an unknown flag), the machine has
# no usable toolchain, which is not the kernel's fault: torch serves instead of refusing a kernel.
PROBE = "int probe(int n) { int s = 0;\n#pragma omp parallel for reduction(+:s)\nfor (int i = 0; i < n; i++) s += i;\nreturn s; }\n"


def compile_library(name: str, source: str) -> Path:
    """Compile `source` (cached); -> the shared library's path. Raises NoCompiler when this machine
    cannot build the probe, NativeError when only `source` fails."""
    cc = compiler()
    if cc is None:
        raise NoCompiler(f"no C compiler ({os.environ.get('CC') or 'cc'}) on PATH")
    flags = compile_flags()
    if name != "probe":
        try:
            compile_library("probe", PRELUDE + PROBE)
        except (NativeError, OSError) as e:
            raise NoCompiler(f"{cc} cannot build with {' '.join(flags)}: {e}") from None
    digest = hashlib.sha256("\0".join((code_text(source), cc, *flags, _cpu_key())).encode()).hexdigest()[:16]
    target = cache_dir() / f"{name}-{digest}.so"
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        src, out = Path(tmp) / f"{name}.c", Path(tmp) / f"{name}.so"
        src.write_text(source)
        proc = subprocess.run([cc, *flags, "-o", str(out), str(src), "-lm"], capture_output=True, text=True)
        if proc.returncode != 0:
            raise NativeError(f"{name}: C compile error:\n{proc.stderr.strip()[-2000:]}")
        os.replace(out, target)  # atomic: a concurrent builder of the same source just wins or loses
    _prune(target.parent, name)
    return target


KEEP_PER_NAME = 12   # three CPU variants of a kernel, and a few edits of each


LINE_DIRECTIVE = re.compile(r'^#line [0-9]+ "[^"\n]*"$', re.MULTILINE)


def code_text(source: str) -> str:
    """`source` without its `#line` directives: the cache key. They only name where the text came
    from (the compiled code is the same: no -g, no __FILE__), so a lab folder's copy of the kernels
    (a test's tmp copy, `slotserver lab init`) finds the libraries the originals built instead of
    compiling every kernel again (~10 s a folder); an edit changes the code and still compiles,
    with messages pointing at its own file."""
    return LINE_DIRECTIVE.sub("", source)


def _prune(folder: Path, name: str) -> None:
    """Every edit of a kernel's C builds a new library: keep the newest few per name. (A library
    still loaded elsewhere stays valid: unlinking a mapped file only drops its directory entry.)"""
    libs = sorted(folder.glob(f"{name}-*.so"), key=lambda p: p.stat().st_mtime, reverse=True)
    for old in libs[KEEP_PER_NAME:]:
        old.unlink(missing_ok=True)


def build(name: str, source: str, origin: str | None = None, strict: bool = False) -> ctypes.CDLL | None:
    """The library for `source`; None where it cannot be built here (no compiler, or turned off).

    `origin`: the file that holds `source` verbatim (a kernel module passes its `.c` file's `c_path`), so the
    compiler's messages point at that file's lines. A compile error raises NativeError with
    `strict` (a kernel module: a broken edit must be refused, not silently replaced by its torch
    form), else logs one warning and returns None.

    Each call returns a new `Library` over the one loaded handle: what a caller declares on it
    (`signature`) reaches no other caller, so a lab edit being loaded never changes the functions
    of the version still serving, even where both hold the same C.
    """
    if off_by_request():
        return None
    full = _located(PRELUDE, str(_PRELUDE_FILE)) + _located(source, origin, name)
    key = hashlib.sha256("\0".join((code_text(full), *compile_flags())).encode()).hexdigest()  # a variant change rebuilds
    if key not in _loaded:
        try:
            _loaded[key] = _load(name, full)
        except NativeError as e:
            if strict and not isinstance(e, NoCompiler):
                raise  # the source's own error: a kernel edit must be refused, not replaced
            log.warning("native kernel %s unavailable, using its torch formulation: %s", name, e)
            _loaded[key] = None
            _unavailable.add(name)
        except OSError as e:  # the machine's fault (cache folder, compiler binary), never the source's
            log.warning("native kernel %s unavailable, using its torch formulation: %s", name, e)
            _loaded[key] = None
            _unavailable.add(name)
    lib = _loaded[key]
    return None if lib is None else Library(lib._name, handle=lib._handle)   # the caller's own (Library)


def _load(name: str, full: str) -> ctypes.CDLL:
    """Compile (or find cached) and load; a cached library that does not load is rebuilt once."""
    path = compile_library(name, full)
    try:
        return ctypes.CDLL(str(path))
    except OSError:
        path.unlink(missing_ok=True)   # truncated by a crash, or built for another machine
        return ctypes.CDLL(str(compile_library(name, full)))


def _located(source: str, origin: str | None, name: str | None = None) -> str:
    """`source` behind a `#line` directive naming where it sits in `origin` (if it is found there).

    Not found there (no origin, or the file changed since its text was read: the lab compiles
    the bytes it validated while the file on disk may already be another save): the whole text of
    a `.c`/`.h` origin is still its own line 1; anything else is named `<name>` from line 1, so a
    compiler message never lands on the prelude's lines, which come just before it."""
    try:
        text = Path(origin).read_text() if origin else ""
    except OSError:
        text = ""
    at = text.find(source) if text else -1
    if at < 0:
        if origin and Path(origin).suffix in (".c", ".h"):
            return f'#line 1 "{origin}"\n{source}'
        return source if name is None else f'#line 1 "<{name}>"\n{source}'
    return f'#line {text[:at].count(chr(10)) + 1} "{origin}"\n{source}'


def c_source(origin: str, name: str) -> str:
    """The C file `name` beside the kernel module `origin` (its `__file__`), as the lab read it
    with the module (`slotserver.runtime.c_sources`); pass the same path as `build`'s origin:
    `build(lib, c_source(__file__, "x.c"), origin=c_path(__file__, "x.c"))`."""
    return c_sources.read(origin, name)


def joined(origin: str, parts: list[tuple[str, str]]) -> str:
    """Several C files (name, text as `c_source` read it) compiled as one unit, in order, each
    behind a `#line` naming its own file: compiler messages point at the right file and line.
    Build the result with `origin=None`. (Each file stays named in the module as
    `native.c_source(__file__, "x.c")`, which is how the lab knows to reload the module.)"""
    return "".join(f'#line 1 "{c_path(origin, name)}"\n{text}\n' for name, text in parts)


def c_path(origin: str, name: str) -> str:
    """The path of the C file `name` beside `origin`: compiler messages point at its lines."""
    return str(Path(origin).parent / name)


def is_bf16(t: torch.Tensor) -> int:
    return int(t.dtype == torch.bfloat16)


def signature(lib: ctypes.CDLL | None, fn: str, n_ptrs: int, n_ints: int, tail: tuple = (),
              replay: bool = False) -> None:
    """Declare `fn(void* x n_ptrs, int64 x n_ints, *tail)` -> int (0 on success).

    `replay`: the function may be recorded into a step graph (slotserver/model/step_graph.py) and
    called again with the same arguments on later steps. Declare it only where every argument is a
    pointer, a shape, a stride or a constant of the call site, never a value of the step (a
    position, a length, a stream): per-step values must reach the C through tensors' contents.

    The ctypes function declared is a fresh one (`lib[fn]`, never read back from `lib`'s
    attributes), published whole as a `Function` by one attribute store: whatever else `lib`
    holds at that moment, the declaration lands on an object no other thread has seen."""
    if lib is not None:
        f = lib[fn]
        f.argtypes = [ctypes.c_void_p] * n_ptrs + [ctypes.c_int64] * n_ints + list(tail)
        f.restype = ctypes.c_int
        setattr(lib, fn, Function(f, replay))


# thread id -> the call a step graph's recorder makes in place of each `Function` call (`recording`)
_RECORDERS: dict[int, Callable] = {}


class Function:
    """A C function of a library `build` returned, as a kernel calls it (`_LIB.fn(...)`): the
    declared ctypes function `fn`, handed to this thread's recorder while one is `recording`.

    Why the recorder is looked up per call rather than swapped into the library while recording
    (as it once was): the lab loads an edited kernel on its worker thread while the engine thread
    records a step graph, and a load that met a swapped-in wrapper was refused (issue 32: 1 save
    in 5 under 8 clients, `'_Watched' object has no attribute 'argtypes'`). Now recording writes
    nothing that another thread reads: a recorder is an entry under its own thread's id, read only
    by calls on that thread, and every library and function object stays as its loader declared
    it. The cost is one Python call around each C call (~0.2 us; a replayed step makes none).
    """

    __slots__ = ("fn", "replay")

    def __init__(self, fn: ctypes._CFuncPtr, replay: bool) -> None:
        self.fn, self.replay = fn, replay

    def __call__(self, *args):
        if _RECORDERS:
            record = _RECORDERS.get(threading.get_ident())
            if record is not None:
                return record(self.fn, self.replay, args)
        return self.fn(*args)


class Library(ctypes.CDLL):
    """What `build` returns: its functions are `Function`s (an undeclared one too, not replayable),
    so a recorder sees every call made through it."""

    def __getattr__(self, name: str) -> Function:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        f = Function(self[name], False)
        setattr(self, name, f)
        return f


@contextlib.contextmanager
def recording(record: Callable[[ctypes._CFuncPtr, bool, tuple], int]):
    """While inside, every `Function` call on this thread is `record(ctypes function, replay, args)`
    (which makes the call); other threads' calls are untouched."""
    me = threading.get_ident()
    outer = _RECORDERS.get(me)
    _RECORDERS[me] = record
    try:
        yield
    finally:
        if outer is None:
            del _RECORDERS[me]
        else:
            _RECORDERS[me] = outer
