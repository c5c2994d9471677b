"""Ahead-of-time Triton compiles for `slotserver lab check`: one `@triton.jit` kernel compiled for
a given GPU architecture (sm_80, sm_90, ...) with no GPU present, `ptxas -v`'s log for its registers,
shared memory and spills, and a compile error turned into `file:line: reason`.

Why separate: this is the only code that talks to triton's compiler and the CUDA toolchain
(`triton.compile`, `GPUTarget`, `ptxas`); `lab_check` decides what to check, in which process, and
how to report it. `lab_check.check_aot` turns these results into `CheckResult`s.
"""

from __future__ import annotations

import contextlib
import inspect
import io
import re
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from slotserver.runtime import lazy_triton


@dataclass
class Resources:
    """What ptxas reports for one kernel on one GPU architecture (per thread, except shared)."""

    regs: int
    shared: int          # bytes of shared memory per block (Triton's dynamic allocation)
    spill_stores: int    # bytes
    spill_loads: int     # bytes


def compile_for(fn, signature: dict, constexprs: dict, arch: int, options: dict | None = None) -> Resources:
    """`triton.compile` for `cuda:arch` (no GPU needed), and what its `ptxas -v` reports: the
    registers and spills (`CompiledKernel.n_regs`/`n_spills` only exist after loading on a GPU).
    options: the launch's num_warps / num_stages (a spec's optional 4th element), as it serves, and
    optionally `aligned`: the argument names the JIT sees as multiples of 16 where it serves
    (pointers from torch's allocator; strides and sizes of the served shapes). The JIT specializes
    those (`tt.divisibility`), which is what lets a masked row load become a 16-byte vector load;
    without it the compile is the worst case (e.g. 2-byte loads of a bf16 weight row)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.backends.nvidia.compiler import get_ptxas, sm_arch_from_capability

    fn = lazy_triton.resolve(fn)   # a kernel file's recorded @jit, made real

    assert set(signature) == set(fn.arg_names), f"AOT signature keys must be {fn.arg_names}"
    ordered = {name: signature[name] for name in fn.arg_names}  # the kernel's parameter order
    options = dict(options or {})
    attrs = {(fn.arg_names.index(a),): [["tt.divisibility", 16]] for a in options.pop("aligned", ())}
    source = triton.compiler.ASTSource(fn, ordered, constexprs, attrs)
    compiled, log = _compile_with_log(triton, source, GPUTarget("cuda", arch, 32), options or None)
    ptx, cubin = compiled.asm.get("ptx", ""), compiled.asm.get("cubin", b"")
    assert ".entry" in ptx and len(cubin) > 0, "no PTX entry point or an empty cubin"
    if "Used " not in log:   # a cubin from triton's cache, or a triton that logs nothing: ptxas -v once more
        log = _ptxas_log(get_ptxas(arch).path, sm_arch_from_capability(arch), ptx)
    number = lambda pattern: int(m.group(1)) if (m := re.search(pattern, log)) else 0  # noqa: E731
    return Resources(regs=number(r"Used (\d+) registers"), shared=int(compiled.metadata.shared),
                     spill_stores=number(r"(\d+) bytes spill stores"),
                     spill_loads=number(r"(\d+) bytes spill loads"))


def _compile_with_log(triton, source, target, options: dict | None):
    """`triton.compile`, and the log of the `ptxas -v` it runs itself (its `dump_ptxas_log` knob prints
    it): the registers and spills of the cubin it made, read without running ptxas a second time
    (on 2 cores the suite's sm_90 compiles spent ~18 s in that second run). "" where the knob is
    missing (an older triton) or the cubin came from triton's cache. One compile at a time: the
    knob and stdout are the process's (`lab check` and the suite compile one spec after another)."""
    knobs = getattr(getattr(triton, "knobs", None), "nvidia", None)
    if knobs is None or not hasattr(knobs, "dump_ptxas_log") or not hasattr(knobs, "scope"):
        return triton.compile(source, target=target, options=options), ""
    out = io.StringIO()
    with knobs.scope():   # the knob and its environment variable as they were, after
        knobs.dump_ptxas_log = True
        with contextlib.redirect_stdout(out):
            compiled = triton.compile(source, target=target, options=options)
    return compiled, out.getvalue()


def _ptxas_log(ptxas: str, gpu: str, ptx: str) -> str:
    """`ptxas -v`'s report on the PTX with the flags triton's own cubin compile passes, so that a
    cached kernel reports the numbers a fresh compile does."""
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "kernel.ptx"
        src.write_text(ptx)
        return subprocess.run([ptxas, "-lineinfo", "-v", *_triton_ptxas_flags(), f"--gpu-name={gpu}", str(src),
                               "-o", str(Path(tmp) / "kernel.cubin")], capture_output=True, text=True, check=True).stderr


def _triton_ptxas_flags() -> list[str]:
    """The code-changing flags this triton's `make_cubin` passes ptxas, read from its source: 3.9
    adds `--regAllocOptLevel=2` (a ptxas 13 workaround; paged decode's first spec compiled without
    launch options: 216 registers without it, 198 with; `-lineinfo` changes none), 3.5 does not."""
    try:
        from triton.backends.nvidia.compiler import CUDABackend
        source = inspect.getsource(CUDABackend.make_cubin)
    except (ImportError, AttributeError, OSError, TypeError):
        return []
    return ["--regAllocOptLevel=2"] if "--regAllocOptLevel=2" in source else []


def compile_error(exc: BaseException, fn, path: Path) -> str:
    """`file:line: reason` for a triton CompilationError (its `node` counts lines from the `def`), at
    the innermost JIT function that failed: a helper the kernel calls, in its file or in one of the
    module's parts (runtime/kernel_parts.py), rather than the kernel's line that calls it."""
    fn = lazy_triton.resolve(fn)
    node, cause, link = getattr(exc, "node", None), exc, exc
    while cause is not None and not getattr(cause, "error_message", None):
        cause = cause.__cause__
    while link is not None:   # the innermost frame in our code (not triton's own tl.* functions)
        owner = _defining(fn, getattr(link, "src", None))
        if owner is not None and hasattr(getattr(link, "node", None), "lineno"):
            fn, node = owner, link.node
        link = link.__cause__
    code = getattr(getattr(fn, "fn", None), "__code__", None)
    path = Path(code.co_filename) if code is not None else path
    text = str(exc).strip().splitlines() or [""]
    reason = getattr(cause, "error_message", None) or text[-1]
    if hasattr(node, "lineno") and hasattr(fn, "def_file_line_number"):
        return f"{path}:{fn.def_file_line_number + node.lineno - 1}: {type(exc).__name__}: {reason}"
    return f"{path}: {type(exc).__name__}: {reason[:300]}"


def _defining(fn, src: str | None):
    """The JIT function whose source is `src`: `fn` or one it reaches through the JIT functions in
    its globals (and theirs), or None."""
    seen, todo = set(), [fn]
    while todo and src:
        f = todo.pop()
        if id(f) in seen:
            continue
        seen.add(id(f))
        if getattr(f, "src", None) == src:
            return f
        names = getattr(getattr(f, "fn", None), "__globals__", {})
        todo += [v for v in names.values() if hasattr(v, "src") and hasattr(v, "def_file_line_number")]
    return None


def spec_dtype(signature: dict) -> str:
    """The dtype label of an AOT spec: its first pointer arguments' element types, deduplicated."""
    ptrs = [t.lstrip("*") for t in signature.values() if t.startswith("*")]
    return "/".join(dict.fromkeys(ptrs[:3]))
