"""What each kernel runs on this CPU: the variant, its ISA flags, and every kernel's code path.

Why: users run on three x86 families and the kernels pick their code from the CPU's flags at run
time (`cpu_features`), so "which path served me" is a question only the running process can
answer. `/props`, `GET /lab` and `slotserver top` all show this one report.

A kernel module may export `cpu_path() -> str` (one short line: what its `cpu` runs here, e.g.
"C int8 dots, AVX-512 VNNI"); otherwise the path is derived from the module's native library
(`_LIB`, the convention of `slotserver.runtime.native`): "C (<variant>)" when it was built, "torch"
when not (no compiler, or SLOTSERVER_NATIVE=0).
"""

from __future__ import annotations

from types import ModuleType

from slotserver.runtime import cpu_features

ISA_PREFIXES = ("avx2", "avx512", "amx", "avx_vnni", "fma", "f16c")


def kernel_path(module: ModuleType, impl: str = "cpu") -> str:
    """One line: what `module.<impl>` computes with on this process's CPU variant."""
    if impl != "cpu":
        return impl
    own = getattr(module, "cpu_path", None)
    if callable(own):
        try:
            return str(own())
        except Exception as e:  # noqa: BLE001 - a report must never break the endpoint that shows it
            return f"unknown ({type(e).__name__})"
    if getattr(module, "_LIB", None) is not None:
        return f"C ({cpu_features.current().variant})"
    return "torch"


def cpu_report(modules: dict[str, ModuleType], impl: str = "cpu") -> dict:
    """{"variant", "forced", "host_variant", "isa": [...], "kernels": {op: path}} for JSON."""
    feats = cpu_features.current()
    return {
        "variant": feats.variant,
        "forced": feats.forced,
        "host_variant": cpu_features.host_variant(),
        "isa": sorted(f for f in feats.flags if f.startswith(ISA_PREFIXES)),
        "kernels": {op: kernel_path(m, impl) for op, m in sorted(modules.items())},
    }
