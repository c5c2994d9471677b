"""An attention output gated by its own projection in one C call (Qwen3.5's gated attention).

`sigmoid_gate(y, g)`: y *= sigmoid(g) elementwise, in place -> y; y float32 or bf16 `[rows, cols]`,
g float32 or bf16 of y's shape (any row strides, unit column strides: g is a slice of the fused
q|k|v|gate projection). The floats of torch's `y * torch.sigmoid(g.float()).to(y.dtype)`, to the
rounding of the exponential (a polynomial's, 2e-7 relative).

Why in C: a step graph (step_graph.py) records only native calls and refuses a step that computes
in torch; with the delta-net layers in C (kernels/delta_net_step.py) this gate was the one torch op
left in a Qwen3.5 decode step. Elsewhere (CUDA, no compiler, SLOTSERVER_NATIVE=0) torch's ops serve.
"""

from __future__ import annotations

from pathlib import Path

import torch

from slotserver.runtime import native

# The C (sigmoid_gate.c beside this file; not hot-reloaded: read once at import).
_C_FILE = Path(__file__).with_name("sigmoid_gate.c")
NATIVE_C = _C_FILE.read_text()
_LIB = native.build("sigmoid_gate", NATIVE_C, origin=str(_C_FILE))
native.signature(_LIB, "sigmoid_gate", 2, 4, (native.ctypes.c_int,) * 3, replay=True)
_FLOATS = (torch.float32, torch.bfloat16)


def sigmoid_gate(y: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """y *= sigmoid(g), in place where the C call applies -> y (else torch's product, a new tensor)."""
    if _LIB is None or y.dim() != 2 or g.shape != y.shape or y.dtype not in _FLOATS or g.dtype not in _FLOATS \
            or y.stride(1) != 1 or g.stride(1) != 1 or not (y.is_cpu and g.is_cpu):
        return y * torch.sigmoid(g.float()).to(y.dtype)
    _LIB.sigmoid_gate(y.data_ptr(), g.data_ptr(), y.shape[0], y.shape[1], y.stride(0), g.stride(0),
                      native.is_bf16(y), native.is_bf16(g), torch.get_num_threads())
    return y
