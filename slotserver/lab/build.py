"""`slotserver lab build`: compile every C library the server may load, on all cores, ahead of use.

Why: each library compiles on its first use (slotserver/runtime/native.py), one after another as
the modules that hold them load: on a fresh 2-core host the default model's first load spent 34 s
compiling 20 libraries (attention.c alone 11 s, qmatmul.c 7 s), and two processes starting at
once (two test workers, two tensor-parallel ranks) each compiled all of them. `make setup` runs
this once after installing: a few processes take the libraries costliest first, so the wall time
is about the longest library's (or the total over the cores), and every later load finds them
cached.

What it compiles is exactly what a load compiles: each job loads the module that builds its
library (a kernel file as the lab loads it, or a slotserver module by import), so the source,
the flags and the CPU variant (`SLOTSERVER_CPU`) are those a server here will ask for. An edited
kernel still compiles on its own load, as before.
"""

from __future__ import annotations

import importlib
import multiprocessing
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]   # the slotserver package
LIBRARY = re.compile(r"""native\.build\(\s*["']([A-Za-z0-9_]+)["']""")   # a module compiling a library at import says this


@dataclass(frozen=True)
class Job:
    """One module to load: a kernel file (`path`) or a slotserver module (`module`); `libraries` are
    the names its `native.build` calls give (its parts' too); `cost` is the bytes of C it reads,
    which orders the jobs (the longest compiles start first)."""
    name: str
    cost: int
    libraries: frozenset[str]
    path: str | None = None
    module: str | None = None


def phases(kernels_dir: Path) -> list[list[Job]]:
    """Every module that builds a library, in two phases, each costliest first. The first holds
    jobs whose libraries no costlier job builds, so no two of them build one library; the second the
    rest (paged_attention builds attention's library, moe_matmul qmatmul's besides its own): run
    beside the job that builds the same library, one would only wait for the other's lock."""
    from slotserver.runtime.loader import module_names, read_source

    jobs = []
    for name in module_names(kernels_dir):
        src = read_source(kernels_dir / f"{name}.py")
        libs = frozenset(lib for text in (src.data, *src.parts.values())
                         for lib in LIBRARY.findall(text.decode("utf-8", errors="replace")))
        if libs:
            jobs.append(Job(name, sum(map(len, src.c_files.values())), libs, path=str(kernels_dir / f"{name}.py")))
    for path in sorted(ROOT.rglob("*.py")):
        if path.parent == Path(__file__).parent or path.relative_to(ROOT).parts[0] == "bundled":
            continue   # this file; an installed wheel's copy of kernels/ (its jobs are above)
        libs = frozenset(LIBRARY.findall(path.read_text(errors="replace")))
        if not libs:
            continue
        c_file = path.with_suffix(".c")
        module = ".".join(("slotserver", *path.relative_to(ROOT).with_suffix("").parts))
        jobs.append(Job(module.rsplit(".", 1)[-1], c_file.stat().st_size if c_file.exists() else 0, libs, module=module))
    first, then, taken = [], [], set()
    for job in sorted(jobs, key=lambda j: -j.cost):
        (then if job.libraries & taken else first).append(job)
        taken |= job.libraries
    return [first, then]


def _run(job: Job) -> tuple[str, float, str | None]:
    """Load `job`'s module (compiling its library unless cached) -> (name, seconds, error or None)."""
    from slotserver.runtime import native
    from slotserver.runtime.kernel_set import load_kernel
    from slotserver.runtime.loader import read_source

    t, before = time.perf_counter(), set(native.unavailable())
    try:
        if job.path is not None:
            load_kernel(read_source(Path(job.path)))
        else:
            importlib.import_module(job.module)
    except Exception as e:   # noqa: BLE001 - any failure is this job's line, never a traceback
        return job.name, time.perf_counter() - t, _first_error(str(e) or type(e).__name__)
    # a library that could not be built without failing the load (a non-strict module, no usable
    # compiler, an unwritable cache): the torch form serves it, which a build must not call success
    missed = sorted(set(native.unavailable()) - before)
    error = f"not built, its torch form serves: {', '.join(missed)} (the warning above says why)" if missed else None
    return job.name, time.perf_counter() - t, error


def _first_error(message: str) -> str:
    """The message's first line, and the compiler's first `file:line:col: error` line if it has one."""
    lines = message.splitlines() or [""]
    error = next((ln.strip() for ln in lines if re.search(r"\.[ch]:\d+:\d+: error", ln)), None)
    return lines[0] if error is None else f"{lines[0]}\n    {error}"


def build_all(kernels_dir: Path, processes: int) -> list[tuple[str, float, str | None]]:
    """Run every job on `processes` fresh processes (spawned: nothing of this one's torch state),
    phase after phase -> each job's (name, seconds, error), in the order they finished."""
    todo = phases(kernels_dir)
    if processes <= 1:
        return [_run(j) for jobs in todo for j in jobs]
    with multiprocessing.get_context("spawn").Pool(max(1, min(processes, max(map(len, todo))))) as pool:
        return [r for jobs in todo for r in pool.imap_unordered(_run, jobs, chunksize=1)]


def default_processes() -> int:
    """One process a usable core (gcc is one core's work)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
