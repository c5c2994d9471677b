"""`slotserver lab check --time`: each kernel timed on serving-size inputs, with its share of the
device's measured copy bandwidth and, where the module counts FLOPs, of its measured matmul rate.

Why in the lab: an edit that passes its reference can still be 5x slower (the first decode
attention kernel was: docs/gpu.md), and the card's limits say how far a kernel is from done. A
share is against what this machine measured in the same run, not a datasheet.

The kernel contract's optional timing part (kernels/*.py):
- `bench_inputs(device, small=False) -> list[(label, args)]`: the `triton`/`cpu` arguments at serving
  sizes (`small`: tiny ones, to check the plumbing on a CPU);
- `bench_flops(*args) -> int` (optional): the useful floating-point operations of one call.
Bytes: every tensor reachable from the arguments (read at least once) plus the outputs (written):
the least a call must move. A module without `bench_inputs` is listed as untimed.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from slotserver.lab.compare import output_tensors
from slotserver.runtime.kernel_set import load_kernel
from slotserver.runtime.loader import ModuleLoadError, read_source


@dataclass
class Timing:
    kernel: str
    label: str
    us: float | None = None          # median microseconds per call
    bytes: int = 0
    flops: int = 0
    detail: str = ""                 # why untimed or failed


@dataclass
class Limits:
    copy_bytes_s: float              # device-to-device copy, read + write counted
    matmul_flops_s: float            # bf16 (float32 on a CPU) square matmul


def tensor_bytes(obj) -> int:
    """Bytes of every distinct tensor reachable from obj (tuples, lists, dicts, dataclasses, NamedTuples)."""
    seen: dict[int, int] = {}

    def walk(o) -> None:
        if isinstance(o, torch.Tensor):
            seen[id(o)] = o.numel() * o.element_size()
        elif isinstance(o, (tuple, list)):
            for x in o:
                walk(x)
        elif isinstance(o, dict):
            for x in o.values():
                walk(x)
        elif dataclasses.is_dataclass(o) and not isinstance(o, type):
            for f in dataclasses.fields(o):
                walk(getattr(o, f.name))
    walk(obj)
    return sum(seen.values())


def default_timer(device: str) -> Callable[[Callable[[], object]], float]:
    """fn -> median seconds: triton's do_bench (L2 flushed between calls) on CUDA, else perf_counter."""
    if device == "cuda":
        import triton.testing

        return lambda fn: triton.testing.do_bench(fn, warmup=10, rep=40, return_mode="median") / 1e3

    def cpu_timer(fn) -> float:
        fn()
        times = []
        for _ in range(3):
            t = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t)
        return statistics.median(times)
    return cpu_timer


def measure_limits(device: str, timer, small: bool = False) -> Limits:
    """The copy bandwidth (1 GiB; 16 MiB when small) and a square matmul's FLOP/s (8192; 256)."""
    n = 1 << (24 if small else 30)
    a = torch.empty(n, dtype=torch.uint8, device=device)
    b = torch.empty_like(a)
    copy = 2 * n / timer(lambda: b.copy_(a))
    m = 256 if small else 8192
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    x = torch.randn(m, m, device=device, dtype=dtype)
    flops = 2 * m ** 3 / timer(lambda: x @ x)
    return Limits(copy, flops)


def time_kernel(path: Path, impl: str, device: str, timer, small: bool = False) -> list[Timing]:
    """One kernel module's `impl` on each of its bench inputs."""
    try:
        mod = load_kernel(read_source(path)).module
    except ModuleLoadError as e:
        return [Timing(path.stem, "", detail=str(e))]
    if not hasattr(mod, "bench_inputs"):
        return [Timing(mod.OP, "", detail="no bench_inputs (untimed)")]
    fn, out = getattr(mod, impl), []
    for label, args in mod.bench_inputs(device, small=small):
        t = Timing(mod.OP, label)
        try:
            result = fn(*args)
            t.bytes = tensor_bytes(args) + sum(o.numel() * o.element_size() for o in output_tensors(result))
            t.flops = int(mod.bench_flops(*args)) if hasattr(mod, "bench_flops") else 0
            t.us = 1e6 * timer(lambda: fn(*args))
        except Exception as e:  # noqa: BLE001 - one failing size is a row, not the end of the table
            t.detail = f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
        out.append(t)
    return out


def format_timings(rows: list[Timing], limits: Limits) -> str:
    """One line per (kernel, size): µs, GB/s and % of copy bandwidth, TFLOP/s and % of the matmul rate."""
    lines = [f"limits measured here: copy {limits.copy_bytes_s / 1e9:.0f} GB/s (read + write), "
             f"matmul {limits.matmul_flops_s / 1e12:.1f} TFLOP/s",
             f"{'kernel':18} {'size':34} {'us':>9} {'GB/s':>7} {'%copy':>6} {'TFLOP/s':>8} {'%mm':>5}"]
    for r in rows:
        if r.us is None:
            lines.append(f"{r.kernel:18} {r.label:34} {r.detail}")
            continue
        s = r.us / 1e6
        bw, fl = r.bytes / s, r.flops / s
        flops = f"{fl / 1e12:8.2f} {fl / limits.matmul_flops_s:5.0%}" if r.flops else ""
        lines.append(f"{r.kernel:18} {r.label:34} {r.us:9.1f} {bw / 1e9:7.0f} {bw / limits.copy_bytes_s:6.0%} {flops}")
    return "\n".join(lines)
