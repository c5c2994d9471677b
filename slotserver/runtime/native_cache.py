"""Compiling a C source into the library cache: the flags, the toolchain probe, the cache's names
and its lock. slotserver/runtime/native.py loads what this builds and re-exports the errors,
PRELUDE and compile_library; a test changing the flags or the compile patches them here, where
they are called.

A library is `<cache dir>/<name>-<digest>.so` (`cache_dir()`), the digest over the code (without
its `#line` directives), the compiler, the flags and this CPU's feature flags, so an edit, a CPU
variant or another machine's library never loads in its place. Compiling one name holds
`<cache dir>/<name>.lock`: a second process wanting the same library meanwhile waits and finds it
built. The newest KEEP_PER_NAME libraries of a name are kept.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import platform
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

from slotserver.runtime import cpu_features

log = logging.getLogger("slotserver.runtime.native")

# Not -ffast-math: with it, GCC links crtfastmath.o into the library, whose constructor turns on
# flush-to-zero for the whole process (every later float op of torch and Python would change).
# These flags alone let the compiler vectorize float reductions. The target flags come from the
# CPU variant (`compile_flags`).
FLAGS = ("-O3", "-fno-math-errno", "-fno-trapping-math", "-fno-signed-zeros", "-fassociative-math",
         "-freciprocal-math", "-fopenmp", "-fPIC", "-shared")

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
    with _compiling(target.parent / f"{name}.lock"):
        if not target.exists():   # another process built it while this one waited
            _compile(cc, flags, name, source, target)
            _prune(target.parent, name)
    return target


@contextlib.contextmanager
def _compiling(lock: Path):
    """Hold `lock` (an exclusive flock) while compiling one name: a second process asking for the
    same library (two test workers, two tensor-parallel ranks, `lab build`'s processes) waits for
    the first and finds it built, instead of compiling it again at the same time (attention.c: ~11 s
    of one core). Without fcntl (not POSIX), or on a filesystem that refuses flock (some network
    mounts), no lock: both compile, and os.replace lets either win."""
    try:
        import fcntl
        f = open(lock, "a")
    except (ImportError, OSError):
        f = None
    with f or contextlib.nullcontext():
        if f is not None:
            with contextlib.suppress(OSError):
                fcntl.flock(f, fcntl.LOCK_EX)   # released when the file closes
        yield


def _compile(cc: str, flags: tuple[str, ...], name: str, source: str, target: Path) -> None:
    log.info("compiling the C library %s (once on this machine: cached in %s)", name, target.parent)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        src, out = Path(tmp) / f"{name}.c", Path(tmp) / f"{name}.so"
        src.write_text(source)
        proc = subprocess.run([cc, *flags, "-o", str(out), str(src), "-lm"], capture_output=True, text=True)
        if proc.returncode != 0:
            raise NativeError(f"{name}: C compile error:\n{proc.stderr.strip()[-2000:]}")
        os.replace(out, target)  # atomic: a reader never sees a partial library


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
