"""Hand-written C kernels for the CPU path: compiled once per machine, cached, loaded with ctypes.

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
  flags (slotserver/runtime/native_cache.py); a second process (or a second test worker) reuses
  it, or waits for it while it compiles. About half a second to 11 s per library (attention.c);
  `slotserver lab build` compiles them all at once on every core. No torch headers, no Python headers. The C must compile for every variant: AVX-512 code sits under
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
import threading
from collections.abc import Callable
from pathlib import Path

import torch  # noqa: F401 - loads torch's libgomp first, so the kernels share its OpenMP runtime

from slotserver.runtime import c_sources, native_cache
# what callers read as native.X (patch the flags, the compile itself, in native_cache: it calls them)
from slotserver.runtime.native_cache import (PRELUDE, NativeError, NoCompiler, _PRELUDE_FILE, cache_dir,  # noqa: F401
                                             code_text, compile_library, compiler)

log = logging.getLogger("slotserver.runtime.native")

_loaded: dict[str, ctypes.CDLL | None] = {}
_unavailable: set[str] = set()   # libraries that could not be built in this process (unavailable())


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
    key = hashlib.sha256("\0".join((code_text(full), *native_cache.compile_flags())).encode()).hexdigest()  # a variant change rebuilds
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
    path = native_cache.compile_library(name, full)
    try:
        return ctypes.CDLL(str(path))
    except OSError:
        path.unlink(missing_ok=True)   # truncated by a crash, or built for another machine
        return ctypes.CDLL(str(native_cache.compile_library(name, full)))


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
