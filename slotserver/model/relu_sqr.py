"""Nemotron-H's MLP activation in one C call: `relu_sqr(y)`, y = max(y, 0)^2 in place.

llama.cpp's nemotron_h MLP blocks (and its MoE experts) are up, ggml_relu then ggml_sqr, down: no
gate. y float32 or bf16 `[rows, cols]` with unit column stride (the up projection's output): the
floats of torch's `torch.relu(y).square()`.

Why in C: a step graph (step_graph.py) records only native calls and refuses a step that computes
in torch, so with the activation in torch no nemotron_h decode step would be replayed. Elsewhere
(CUDA, no compiler, SLOTSERVER_NATIVE=0) torch's ops serve, with the same floats.
"""

from __future__ import annotations

from pathlib import Path

import torch

from slotserver.runtime import native

# The C (relu_sqr.c beside this file; not hot-reloaded: read once at import).
_C_FILE = Path(__file__).with_name("relu_sqr.c")
NATIVE_C = _C_FILE.read_text()
_LIB = native.build("relu_sqr", NATIVE_C, origin=str(_C_FILE))
native.signature(_LIB, "relu_sqr", 1, 3, (native.ctypes.c_int,) * 2, replay=True)


def relu_sqr(y: torch.Tensor) -> torch.Tensor:
    """max(y, 0)^2: in place by one C call where it applies (-> y), else torch's (a new tensor)."""
    if _LIB is None or y.dim() != 2 or y.dtype not in (torch.float32, torch.bfloat16) or y.stride(1) != 1 \
            or not y.is_cpu:
        return torch.relu(y).square()
    _LIB.relu_sqr(y.data_ptr(), y.shape[0], y.shape[1], y.stride(0), native.is_bf16(y), torch.get_num_threads())
    return y
