"""Writing a step's new K/V rows into a strided layout: one C call for K and V together.

`write_rows(k_dst, v_dst, streams, positions, k, v)` stores `k[t]` / `v[t]` (`[tokens, kv_heads,
head_dim]`, float32 or bf16) at `(streams[t], positions[t])` of the logical `[stream, cell, kv_head,
head_dim]` views `k_dst` / `v_dst` (any strides, float32 / bf16 / float16), converting with
round-to-nearest-even as torch's `.to` does: the same bytes as `dst.index_put_((streams,
positions), src.to(dst.dtype))`, which is the fallback (no compiler, other dtypes). CUDA views take
one Triton launch (kv_rows_triton.py).

Why: a decode step writes one row per layer; the torch form is two casts and two `index_put_`
(~13 us per layer at batch 1, ~0.4 ms of a ~8 ms step), the C form one call (~8 us with its
checks, ~4 us of it the ctypes call). Layouts
call it from `write`; it checks the indices against the views' shapes (an out-of-range stream or
position raises, as `index_put_` does, instead of writing outside the cache).
"""

from __future__ import annotations

from pathlib import Path

import torch

from slotserver.runtime import native

# The C (kv_rows.c beside this file; not hot-reloaded: read once at import).
_C_FILE = Path(__file__).with_name("kv_rows.c")
NATIVE_C = _C_FILE.read_text()
_LIB = native.build("kv_rows", NATIVE_C, origin=str(_C_FILE))
native.signature(_LIB, "kv_write_rows", 6, 15, (native.ctypes.c_int,) * 3, replay=True)
_DST = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}
_SRC = (torch.float32, torch.bfloat16)


def write_rows(k_dst: torch.Tensor, v_dst: torch.Tensor, streams: torch.Tensor, positions: torch.Tensor,
               k: torch.Tensor, v: torch.Tensor, dst_ok: bool | None = None) -> None:
    """k_dst, v_dst: `[streams, cells, kv_heads, head_dim]` views; k, v: `[tokens, kv_heads, head_dim]`.
    dst_ok: `dst_native(k_dst, v_dst)` where the caller checked it once (a layout, at creation)."""
    if k_dst.is_cuda:   # one Triton launch (kv_rows_triton.py), where it fits
        from slotserver.runtime import kv_rows_triton

        if kv_rows_triton.fits(k_dst, v_dst, streams, positions, k, v):
            kv_rows_triton.write(k_dst, v_dst, streams, positions, k, v)
            return
    if dst_ok is None:
        dst_ok = dst_native(k_dst, v_dst)
    if not (dst_ok and _src_native(k_dst, streams, positions, k, v)):
        k_dst.index_put_((streams, positions), k if k.dtype == k_dst.dtype else k.to(k_dst.dtype))
        v_dst.index_put_((streams, positions), v if v.dtype == v_dst.dtype else v.to(v_dst.dtype))
        return
    t, h, d = k.shape
    rc = _LIB.kv_write_rows(k_dst.data_ptr(), v_dst.data_ptr(), k.data_ptr(), v.data_ptr(), streams.data_ptr(),
                            positions.data_ptr(), t, h, d, *k_dst.stride()[:3], *v_dst.stride()[:3],
                            k.stride(0), k.stride(1), v.stride(0), v.stride(1), k_dst.shape[0], k_dst.shape[1],
                            _DST[k_dst.dtype], native.is_bf16(k), native.is_bf16(v))
    if rc:
        raise IndexError(f"KV write: a stream or position out of range (streams {streams.tolist()}, "
                         f"positions {positions.tolist()}, cache {tuple(k_dst.shape[:2])})")


def dst_native(k_dst: torch.Tensor, v_dst: torch.Tensor) -> bool:
    """Whether the C writes into these views (CPU, a float dtype, unit head_dim stride)."""
    return (_LIB is not None and k_dst.is_cpu and v_dst.is_cpu and k_dst.dtype in _DST and v_dst.dtype == k_dst.dtype
            and k_dst.dim() == 4 and v_dst.shape == k_dst.shape and k_dst.stride(3) == 1 and v_dst.stride(3) == 1)


def _src_native(k_dst, streams, positions, k, v) -> bool:
    return (k.dtype in _SRC and v.dtype in _SRC and k.is_cpu and v.is_cpu and k.dim() == 3 and v.shape == k.shape
            and k_dst.shape[2:] == k.shape[1:] and k.stride(2) == 1 and v.stride(2) == 1
            and streams.dtype == torch.int64 and positions.dtype == torch.int64 and streams.is_contiguous()
            and positions.is_contiguous() and streams.shape == positions.shape == k.shape[:1] and streams.is_cpu
            and positions.is_cpu)
