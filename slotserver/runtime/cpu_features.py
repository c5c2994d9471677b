"""Which CPU features this process may use: the host's flags, capped by `SLOTSERVER_CPU`.

Why a cap: users run on three x86 families (AVX2 only; AVX-512 with BF16/VNNI; AVX-512 with
AMX), and each takes different code paths (the native kernels' `-march` and their AVX-512 loops,
the AMX int4 matmul, oneDNN's pre-packed bf16 weights). To test and benchmark the smaller paths
on a bigger machine, `SLOTSERVER_CPU=avx2|avx512|amx` forces a variant; `auto` (the default)
takes the best the host has. A forced variant is capped by the host: asking for `amx` on a CPU
without AMX gives what the host has (never an illegal instruction).

This is the one place that reads `SLOTSERVER_CPU`. What follows it:
- `slotserver.runtime.native`: the compiler's target flags (`march_flags`) and the library cache key;
- `kernels/q4_matmul.py`: the AMX kernel only where the variant is `amx`;
- `slotserver.model.linear`: oneDNN's pre-packed bf16 weights only where bf16 runs natively.
torch's own kernels read their own variables, before torch's first op: `emulation_env` lists them
(`ATEN_CPU_CAPABILITY`, `ONEDNN_MAX_CPU_ISA`), for a subprocess that must look like such a host.
"""

from __future__ import annotations

import functools
import os
import platform
from dataclasses import dataclass
from pathlib import Path

VARIANTS = ("avx2", "avx512", "amx")   # in increasing order: each includes the one before
ENV = "SLOTSERVER_CPU"
AVX2 = frozenset({"avx2", "fma", "f16c"})
AVX512 = frozenset({"avx512f", "avx512bw", "avx512vl", "avx512dq"})
AMX = frozenset({"amx_tile", "amx_bf16"})
# flags a variant drops from the host's set (a cap: what a smaller CPU would not have)
_ABOVE = {"avx2": ("avx512", "amx", "avx_ne_convert", "avx_vnni"), "avx512": ("amx",), "amx": ()}


class CpuVariantError(ValueError):
    """`SLOTSERVER_CPU` names no variant."""


@dataclass(frozen=True)
class CpuFeatures:
    """variant: avx2 | avx512 | amx, or "other" (not x86, or x86 below AVX2: plain -march=native).
    flags: the host's /proc/cpuinfo flags the process may use (capped by the variant)."""

    variant: str
    flags: frozenset[str]
    forced: bool = False

    def has(self, *names: str) -> bool:
        return all(n in self.flags for n in names)

    @property
    def amx(self) -> bool:
        """The AMX int4 matmul may run (the OS must still grant tile data, see q4_matmul)."""
        return self.variant == "amx" and self.flags >= AMX

    @property
    def onednn_bf16(self) -> bool:
        """oneDNN runs bf16 GEMMs natively (torch's own test: AVX-512 BW/VL/DQ, or AVX-NE-CONVERT);
        elsewhere torch computes bf16 matmuls by conversion and pre-packing is refused."""
        return self.variant == "other" or self.flags >= AVX512 or "avx_ne_convert" in self.flags

    def march_flags(self) -> tuple[str, ...]:
        """The compiler's target flags for the native kernels under this variant."""
        if self.variant == "avx2":   # x86-64-v3 (AVX2, FMA, F16C, BMI): what every AVX2 host runs
            return ("-march=x86-64-v3", "-mtune=native", "-mprefer-vector-width=256")
        if self.variant == "avx512" and host_flags() & AMX:   # -march=native would enable AMX: take it out
            return ("-march=native", "-mno-amx-tile", "-mno-amx-int8", "-mno-amx-bf16", "-mprefer-vector-width=512")
        if self.variant in ("avx512", "amx"):
            return ("-march=native", "-mprefer-vector-width=512")
        return ("-march=native",)


@functools.cache
def host_flags() -> frozenset[str]:
    """This CPU's feature flags (Linux /proc/cpuinfo); empty where unreadable."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def physical_cores(cpuinfo: str | None = None, allowed: set[int] | None = None) -> int:
    """Physical cores this process may run on (hyper-threads of one core count once), as llama.cpp's
    default thread count: two threads on the two halves of one core fight for its units, so matmul
    -bound work gets no faster and OpenMP barriers get slower. Falls back to the usable CPU count."""
    allowed = os.sched_getaffinity(0) if allowed is None and hasattr(os, "sched_getaffinity") else allowed
    try:
        text = Path("/proc/cpuinfo").read_text() if cpuinfo is None else cpuinfo
    except OSError:
        text = ""
    cores, cpu, phys = set(), None, "0"
    for line in text.splitlines():
        key, _, value = (s.strip() for s in line.partition(":"))
        if key == "processor":
            cpu, phys = int(value), "0"
        elif key == "physical id":
            phys = value
        elif key == "core id" and cpu is not None and (allowed is None or cpu in allowed):
            cores.add((phys, value))
    return len(cores) or (len(allowed) if allowed else os.cpu_count() or 1)


def host_variant(flags: frozenset[str] | None = None) -> str:
    """The best variant `flags` (default: this host's) support; "other" below AVX2 or off x86."""
    flags = host_flags() if flags is None else flags
    if platform.machine().lower() not in ("x86_64", "amd64", "i686", "i386") or not flags >= AVX2:
        return "other"
    if not flags >= AVX512:
        return "avx2"
    return "amx" if flags >= AMX else "avx512"


def current(env: dict[str, str] | None = None) -> CpuFeatures:
    """The features this process may use: `SLOTSERVER_CPU` (from `env`, default os.environ) capped
    by the host. Raises CpuVariantError on an unknown value."""
    want = (os.environ if env is None else env).get(ENV, "auto").strip().lower() or "auto"
    if want not in ("auto", *VARIANTS):
        raise CpuVariantError(f"{ENV} must be auto, {', '.join(VARIANTS)}; got {want!r}")
    flags, best = host_flags(), host_variant()
    if want == "auto" or best == "other":
        return CpuFeatures(best, flags)
    variant = VARIANTS[min(VARIANTS.index(want), VARIANTS.index(best))]
    dropped = {f for f in flags if any(f.startswith(p) for p in _ABOVE[variant])}
    return CpuFeatures(variant, flags - dropped, forced=True)


def supports(variant: str) -> bool:
    """Whether this host can run `variant` (for tests that run each one)."""
    best = host_variant()
    return best != "other" and VARIANTS.index(variant) <= VARIANTS.index(best)


def emulation_env(variant: str) -> dict[str, str]:
    """Environment for a subprocess that should behave like a `variant` host throughout: this
    package's choices and torch's (ATen's vectorized kernels, oneDNN's ISA; both are read once,
    before torch's first op, so they cannot be changed inside a running process)."""
    assert variant in VARIANTS, variant
    aten = {"avx2": "avx2", "avx512": "avx512", "amx": "avx512"}[variant]
    onednn = {"avx2": "AVX2", "avx512": "AVX512_CORE_BF16", "amx": "ALL"}[variant]
    return {ENV: variant, "ATEN_CPU_CAPABILITY": aten, "ONEDNN_MAX_CPU_ISA": onednn}
