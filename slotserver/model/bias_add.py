"""A linear layer's bias added into its output rows in one C call (qwen2's q|k|v biases).

`add_bias(y, bias)`: y[r, :] += bias for every row r, in place; y float32 or bf16 `[rows, out]`
(any row stride, unit column stride), bias float32 `[out]` (a layer keeps its bias as loaded). The
same floats as torch's `y.add_(bias.to(y.dtype))`: for a bf16 y the bias is rounded to bf16 first,
then each sum is one float32 add rounded once to y's dtype (to nearest even).

Why in C: a step graph (step_graph.py) records only native calls, and refuses a step that computes
anything in torch. A qwen2 step added its q|k|v bias with `add_`, so no decode step of a qwen2 model
was ever replayed: every step paid its Python (Qwen2.5-Coder-0.5B Q4_K_M on a 2-core Zen 5 with
AVX-512 VNNI/BF16, decode b=1 11.7-12.1 -> 10.4-10.6 ms once replayed; docs/performance.md, tenth
round). Without a compiler (or with SLOTSERVER_NATIVE=0) torch's add serves; the step then runs
without a graph, as before.
"""

from __future__ import annotations

from pathlib import Path

import torch

from slotserver.runtime import native

# The C (bias_add.c beside this file; not hot-reloaded: read once at import).
_C_FILE = Path(__file__).with_name("bias_add.c")
NATIVE_C = _C_FILE.read_text()
_LIB = native.build("bias_add", NATIVE_C, origin=str(_C_FILE))
native.signature(_LIB, "add_bias", 2, 3, (native.ctypes.c_int,), replay=True)


def add_bias(y: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """y += bias broadcast over y's rows, in place -> y (torch's add_ where the C call does not apply)."""
    if _LIB is None or y.dim() != 2 or y.dtype not in (torch.float32, torch.bfloat16) or y.stride(1) != 1 \
            or bias.dtype != torch.float32 or not bias.is_contiguous() or bias.shape != (y.shape[1],) \
            or not (y.is_cpu and bias.is_cpu):
        return y.add_(bias.to(y.dtype))
    rc = _LIB.add_bias(y.data_ptr(), bias.data_ptr(), y.shape[0], y.shape[1], y.stride(0), native.is_bf16(y))
    if rc != 0:
        raise RuntimeError(f"add_bias (C) failed with {rc}")
    return y
