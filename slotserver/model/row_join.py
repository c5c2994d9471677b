"""Two tensors' rows joined along their last dim in one C call: deepseek2's latent-attention q and
k rows (mla_attention.py: the rotated part, then the latent part).

`join_rows(a, b)`: `[T, H, na]` and `[T, H, nb]` of one dtype (any token and head strides, unit last
stride) -> a new contiguous `[T, H, na + nb]`, the same values as `torch.cat([a, b], dim=-1)`.

Why in C: a step graph (step_graph.py) records only native calls and refuses a step that computes
in torch; with torch's cat a latent-attention model never replayed a decode step. Without a
compiler (or with SLOTSERVER_NATIVE=0) torch's cat serves, and such steps run as usual.
"""

from __future__ import annotations

from pathlib import Path

import torch

from slotserver.runtime import native

# The C (row_join.c beside this file; not hot-reloaded: read once at import).
_C_FILE = Path(__file__).with_name("row_join.c")
NATIVE_C = _C_FILE.read_text()
_LIB = native.build("row_join", NATIVE_C, origin=str(_C_FILE))
native.signature(_LIB, "join_rows", 3, 8, (native.ctypes.c_int,), replay=True)


def join_rows(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """[T, H, na] | [T, H, nb] -> [T, H, na + nb] (torch's cat where the C call does not apply)."""
    if _LIB is None or a.dim() != 3 or b.dim() != 3 or a.shape[:2] != b.shape[:2] or a.dtype != b.dtype or a.stride(2) != 1 \
            or b.stride(2) != 1 or not (a.is_cpu and b.is_cpu):
        return torch.cat([a, b], dim=-1)
    t, h, na = a.shape
    out = torch.empty(t, h, na + b.shape[2], dtype=a.dtype)
    rc = _LIB.join_rows(a.data_ptr(), b.data_ptr(), out.data_ptr(), t, h, na, b.shape[2], a.stride(0), a.stride(1),
                        b.stride(0), b.stride(1), a.element_size())
    if rc != 0:
        raise RuntimeError(f"join_rows (C) failed with {rc}")
    return out
