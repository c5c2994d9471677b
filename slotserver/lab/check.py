"""`slotserver lab check`: every kernel against its reference, every Triton kernel compiled for
real GPUs (the compile itself: `lab_aot`), every layout through its contract, on a machine with
or without a GPU.

Why subprocesses: triton decides once per process, when it is first imported, whether `@jit`
functions (its own `tl.sum`, `tl.max`, ... included) are interpreted or compiled. An interpreted
kernel in a process that imported triton normally fails with "Cannot call @triton.jit'd outside of
the scope of a kernel", and a compile in a process that imported it with TRITON_INTERPRET=1 fails
on an assertion in triton's gluon standard library. So each kind of check runs in this process
when its mode matches, and otherwise in a fresh `python -m slotserver.lab.check --worker ...`.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import torch

from slotserver.lab.aot import Resources, compile_error, compile_for, spec_dtype
from slotserver.lab.compare import compare_outputs, move_inputs, output_tensors, where_in  # noqa: F401 - re-exported
from slotserver.runtime.kernel_set import load_kernel
from slotserver.runtime.layouts import available_layouts
from slotserver.runtime.loader import ModuleLoadError, default_dir, module_names, read_source, resolve_in_folder
from slotserver.lab.validate import Numerics, kernel_numerics, validate_layout

ARCHS = (80, 90)
DTYPES = (torch.float32, torch.bfloat16)
N_CASES = 6


@dataclass
class CheckResult:
    kernel: str                  # op name (numerics), "op:kernel_fn" (aot), layout name (layout)
    impl: str                    # "cpu" | "triton" | "aot" | "layout"
    dtype: str = ""
    max_err: float | None = None
    tol: float | None = None
    ok: bool = True
    detail: str = ""             # why it failed, with file:line when known
    resources: dict[str, Resources] = field(default_factory=dict)  # "sm_80" -> Resources


def run_lab_check(kernels_dir: Path | None = None, layouts_dir: Path | None = None,
                  n_cases: int = N_CASES, aot: bool = True) -> list[CheckResult]:
    """All checks: cpu and triton numerics, AOT compiles for sm_80/sm_90, layout contracts."""
    kernels_dir = Path(kernels_dir or default_dir("kernels"))
    results = [r for p in kernel_files(kernels_dir) for r in check_numerics(p, "cpu", n_cases=n_cases)]
    results += triton_numerics(kernels_dir, n_cases)
    if aot:
        results += aot_checks(kernels_dir)
    return results + check_layouts(layouts_dir, kernels_dir)


def kernel_files(kernels_dir: Path) -> list[Path]:
    """What the lab lists (module_names): `<identifier>.py` files inside the folder."""
    return [Path(kernels_dir) / f"{n}.py" for n in module_names(kernels_dir)]


def triton_mode() -> str:
    """'interpret' or 'compile': how this process's triton runs `@jit` functions (fixed at import)."""
    import triton.language.standard as std

    return "interpret" if type(std.sum).__name__ == "InterpretedFunction" else "compile"


def triton_numerics(kernels_dir: Path, n_cases: int = N_CASES) -> list[CheckResult]:
    """Every module's `triton` against `reference`: on the GPU if there is one, else interpreted."""
    mode = triton_mode()
    if mode == "compile" and torch.cuda.is_available():
        return [r for p in kernel_files(kernels_dir) for r in check_numerics(p, "triton", n_cases, "cuda")]
    if mode == "interpret":
        return [r for p in kernel_files(kernels_dir) for r in check_numerics(p, "triton", n_cases)]
    return _in_worker("interpret", kernels_dir, n_cases, {"TRITON_INTERPRET": "1"})


def aot_checks(kernels_dir: Path, archs: tuple[int, ...] = ARCHS) -> list[CheckResult]:
    if triton_mode() == "compile":
        return [r for p in kernel_files(kernels_dir) for r in check_aot(p, archs)]
    return _in_worker("aot", kernels_dir, 0, {"TRITON_INTERPRET": None})


def check_numerics(path: Path, impl: str, n_cases: int = N_CASES, device: str = "cpu",
                   dtypes: tuple[torch.dtype, ...] = DTYPES) -> list[CheckResult]:
    """`impl` of one kernel module vs its own `reference` per dtype (the lab's one validator)."""
    try:
        mod = load_kernel(read_source(path)).module       # the contract is enforced: file and name
    except ModuleLoadError as e:
        return [CheckResult(path.stem, impl, ok=False, detail=str(e))]
    results = []
    for dtype in (d for d in dtypes if d in mod.TOL):
        gen = torch.Generator().manual_seed(0)
        try:
            n = kernel_numerics(getattr(mod, impl), mod, dtype, gen, n_cases, device, path)
            detail = "" if n.ok else (f"{path}:{n.line}: {n.reason}" if n.line != "?" else n.reason)
        except Exception as e:  # noqa: BLE001 - a broken example_inputs/reference is a failed check
            n, detail = Numerics(ok=False, tol=float(mod.TOL[dtype])), f"{where_in(e, path)}: {type(e).__name__}: {str(e)[:300]}"
        results.append(CheckResult(mod.OP, impl, str(dtype).removeprefix("torch."), n.max_err, n.tol, n.ok, detail))
    return results


def check_aot(path: Path, archs: tuple[int, ...] = ARCHS) -> list[CheckResult]:
    """Compile every `AOT` spec of a module for each arch: PTX and cubin must come out."""
    try:
        specs = getattr(load_kernel(read_source(path)).module, "AOT", [])
    except ModuleLoadError as e:
        return [CheckResult(path.stem, "aot", ok=False, detail=str(e))]
    results = []
    for fn, signature, constexprs, *options in specs:   # options: launch options (num_warps, num_stages)
        res = CheckResult(f"{path.stem}:{fn.__name__}", "aot", spec_dtype(signature))
        for arch in archs:
            try:
                res.resources[f"sm_{arch}"] = compile_for(fn, signature, constexprs, arch, *options)
            except Exception as e:  # noqa: BLE001
                res.ok, res.detail = False, f"sm_{arch}: {compile_error(e, fn, path)}"
        results.append(res)
    return results


def check_layouts(layouts_dir: Path | None = None, kernels_dir: Path | None = None) -> list[CheckResult]:
    """Each layout: written rows come back through export, a copied stream equals its source,
    and the cpu attention over its view equals the reference over the exported (canonical) K/V."""
    kernels_dir = Path(kernels_dir or default_dir("kernels"))
    try:   # the attention kernels, loaded once for every layout
        paged = kernels_dir / "paged_attention.py"
        kernels = (_kernel(kernels_dir, "attention"), _kernel(kernels_dir, "paged_attention") if paged.is_file() else None)
    except Exception as e:  # noqa: BLE001 - a broken attention kernel fails the checks, not the command
        kernels = f"{type(e).__name__}: {str(e)[:300]}"
    return [_check_layout(name, layouts_dir, kernels) for name in available_layouts(layouts_dir)]


def _check_layout(name: str, layouts_dir: Path | None, kernels: tuple | str) -> CheckResult:
    """One layout through `validate_layout`, the validator the live reload uses."""
    try:
        if isinstance(kernels, str):
            raise RuntimeError(kernels)
        src = read_source(resolve_in_folder(layouts_dir or default_dir("layouts"), name, "layout"))
        check = validate_layout(src, *kernels, seed=0)
    except Exception as e:  # noqa: BLE001 - reported as this layout's failed check
        check = {"ok": False, "reason": f"{type(e).__name__}: {str(e)[:300]}"}
    detail = "" if check["ok"] else check["reason"] + (f" (line {check['line']})" if check.get("line", "?") != "?" else "")
    return CheckResult(name, "layout", "float32", check.get("max_err"), None, check["ok"], detail)


def _kernel(kernels_dir: Path, op: str):
    return load_kernel(read_source(kernels_dir / f"{op}.py")).module


def _in_worker(kind: str, kernels_dir: Path, n_cases: int, env_changes: dict) -> list[CheckResult]:
    env = dict(os.environ)
    for key, value in env_changes.items():
        env.pop(key, None) if value is None else env.__setitem__(key, value)
    cmd = [sys.executable, "-m", "slotserver.lab.check", "--worker", kind,
           "--kernels-dir", str(kernels_dir), "--n-cases", str(n_cases)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(_MARK)]
    if proc.returncode or not lines:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-5:]
        return [CheckResult(f"({kind} worker)", kind, ok=False, detail=" | ".join(tail))]
    return [_result_from(d) for d in json.loads(lines[-1][len(_MARK):])]


_MARK = "LAB-CHECK-RESULTS "


def _result_from(d: dict) -> CheckResult:
    d["resources"] = {k: Resources(**v) for k, v in d.get("resources", {}).items()}
    return CheckResult(**d)


def format_report(results: list[CheckResult]) -> str:
    """A plain-text table: one row per check; AOT rows carry sm_80 / sm_90 regs, shared, spills."""
    archs = [f"sm_{a}" for a in ARCHS]
    head = ["kernel", "impl", "dtype", "max err", "tol", "ok"] + [f"{a} regs/smem/spill" for a in archs]
    rows = [head]
    for r in results:
        err = "" if r.max_err is None else f"{r.max_err:.2e}"
        tol = "" if r.tol is None else f"{r.tol:.0e}"
        res = [_fmt_resources(r.resources.get(a)) for a in archs]
        rows.append([r.kernel, r.impl, r.dtype, err, tol, "PASS" if r.ok else "FAIL"] + res)
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    failures = [f"FAIL {r.kernel} [{r.impl} {r.dtype}]: {r.detail or f'max error {r.max_err:.3g} > tol {r.tol}'}"
                for r in results if not r.ok]
    n_ok = sum(r.ok for r in results)
    return "\n".join(lines + [""] + failures + [f"{n_ok}/{len(results)} checks passed"])


def _fmt_resources(res: Resources | None) -> str:
    if res is None:
        return ""
    return f"{res.regs}/{res.shared}/{res.spill_stores}"


def _worker_main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="lab check worker (run by run_lab_check)")
    parser.add_argument("--worker", choices=("interpret", "aot"), required=True)
    parser.add_argument("--kernels-dir", type=Path, required=True)
    parser.add_argument("--n-cases", type=int, default=N_CASES)
    args = parser.parse_args(argv)
    if "triton" not in sys.modules:  # the mode is chosen by the first import of triton
        os.environ.pop("TRITON_INTERPRET", None)
        if args.worker == "interpret":
            os.environ["TRITON_INTERPRET"] = "1"
    want = "interpret" if args.worker == "interpret" else "compile"
    if triton_mode() != want:
        print(f"lab check worker: triton runs in {triton_mode()} mode here, {want} needed", file=sys.stderr)
        return 2
    if args.worker == "interpret":
        results = [r for p in kernel_files(args.kernels_dir) for r in check_numerics(p, "triton", args.n_cases)]
    else:
        results = [r for p in kernel_files(args.kernels_dir) for r in check_aot(p)]
    print(_MARK + json.dumps([dataclasses.asdict(r) for r in results]))
    return 0


if __name__ == "__main__":
    sys.exit(_worker_main())
