"""Granite's residual and logit multipliers as C calls: `scaled_add(x, y, s)` (x += s * y, a branch
output scaled into the residual) and `scale_rows(x, s)` (x *= s, the logits by 1 / logit_scale).

x float32 `[rows, cols]` with unit column stride (the residual, the logits); y float32 or bf16 of
x's shape. The floats of torch's `x + y * s` (the product rounded first, in y's dtype) and
`x * s`; llama.cpp's granite graphs scale then add (ggml_scale, ggml_add), and scale the logits by
1 / logit_scale, as here.

Why in C: a step graph (step_graph.py) records only native calls and refuses a step that computes
in torch, so no granite decode step (granite, granitemoe, granitehybrid) was replayed: every step
paid its Python between ~12 C calls a layer. Elsewhere (CUDA, no compiler, SLOTSERVER_NATIVE=0)
torch's ops serve, with the same floats.
"""

from __future__ import annotations

from pathlib import Path

import torch

from slotserver.runtime import native

# The C (scaled_add.c beside this file; not hot-reloaded: read once at import).
_C_FILE = Path(__file__).with_name("scaled_add.c")
NATIVE_C = _C_FILE.read_text()
_LIB = native.build("scaled_add", NATIVE_C, origin=str(_C_FILE))
native.signature(_LIB, "scaled_add", 2, 4, (native.ctypes.c_float, native.ctypes.c_int, native.ctypes.c_int),
                 replay=True)
native.signature(_LIB, "scale_rows", 1, 3, (native.ctypes.c_float, native.ctypes.c_int), replay=True)


def _rows(x: torch.Tensor) -> bool:
    return x.dim() == 2 and x.stride(1) == 1 and x.is_cpu


def scaled_add(x: torch.Tensor, y: torch.Tensor, s: float) -> torch.Tensor:
    """x + s * y: in place into x by one C call where it applies (-> x), else torch's (a new tensor)."""
    if _LIB is None or x.dtype != torch.float32 or y.dtype not in (torch.float32, torch.bfloat16) \
            or y.shape != x.shape or not (_rows(x) and _rows(y)):
        return x + y * s
    _LIB.scaled_add(x.data_ptr(), y.data_ptr(), x.shape[0], x.shape[1], x.stride(0), y.stride(0), s,
                    native.is_bf16(y), torch.get_num_threads())
    return x


def scale_rows(x: torch.Tensor, s: float) -> torch.Tensor:
    """x *= s, in place (one C call where it applies) -> x."""
    if _LIB is None or x.dtype != torch.float32 or not _rows(x):
        return x.mul_(s)
    _LIB.scale_rows(x.data_ptr(), x.shape[0], x.shape[1], x.stride(0), s, torch.get_num_threads())
    return x
