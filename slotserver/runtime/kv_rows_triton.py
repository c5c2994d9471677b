"""The K/V row write on a GPU: one Triton launch for K and V together, with the dtype conversion.

What `kv_rows.write_rows` does with its C on the CPU, for CUDA views: store `k[t]` / `v[t]`
(`[tokens, kv_heads, head_dim]`) at `(streams[t], positions[t])` of the logical `[stream, cell,
kv_head, head_dim]` views, converting to the cache's dtype (round to nearest even, as `.to`).
Why: the torch form is two casts and two `index_put_` per layer (a bf16 model over llama.cpp's f16
cache), four of a decode step's ~16 launches per layer, and a decode step on a GPU is bound by
its launches (docs/gpu.md). A row whose stream or position is outside the views is not written
(checking it on the host would wait for the device; the engine never sends one).

Imported only when a CUDA tensor is written (triton is not loaded for CPU serving).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _kv_write_kernel(k_ptr, v_ptr, kd_ptr, vd_ptr, streams_ptr, pos_ptr, sk_t, sk_h, sv_t, sv_h,
                     dk_s, dk_c, dk_h, dv_s, dv_c, dv_h, n_streams, n_cells, n_heads, head_dim,
                     BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr):
    """Program t: token t's K and V rows, every head, into its (stream, cell)."""
    t = tl.program_id(0).to(tl.int64)
    s = tl.load(streams_ptr + t).to(tl.int64)
    c = tl.load(pos_ptr + t).to(tl.int64)
    if (s < 0) | (s >= n_streams) | (c < 0) | (c >= n_cells):
        return
    h = tl.arange(0, BLOCK_H)[:, None]
    d = tl.arange(0, BLOCK_D)[None, :]
    m = (h < n_heads) & (d < head_dim)
    k = tl.load(k_ptr + t * sk_t + h * sk_h + d, mask=m)
    tl.store(kd_ptr + s * dk_s + c * dk_c + h * dk_h + d, k.to(kd_ptr.dtype.element_ty), mask=m)
    v = tl.load(v_ptr + t * sv_t + h * sv_h + d, mask=m)
    tl.store(vd_ptr + s * dv_s + c * dv_c + h * dv_h + d, v.to(vd_ptr.dtype.element_ty), mask=m)


def fits(k_dst: torch.Tensor, v_dst: torch.Tensor, streams: torch.Tensor, positions: torch.Tensor,
         k: torch.Tensor, v: torch.Tensor) -> bool:
    """Views and rows this launch serves: 4-D views and 3-D rows of one shape, unit head_dim strides."""
    return (k_dst.dim() == 4 and v_dst.shape == k_dst.shape and k.dim() == 3 and v.shape == k.shape
            and k_dst.shape[2:] == k.shape[1:] and streams.shape == positions.shape == k.shape[:1]
            and k_dst.stride(3) == v_dst.stride(3) == k.stride(2) == v.stride(2) == 1
            and streams.is_contiguous() and positions.is_contiguous()
            and k_dst.dtype in (torch.float32, torch.bfloat16, torch.float16) and v_dst.dtype == k_dst.dtype)


def write(k_dst: torch.Tensor, v_dst: torch.Tensor, streams: torch.Tensor, positions: torch.Tensor,
          k: torch.Tensor, v: torch.Tensor) -> None:
    """One launch; the caller checked `fits`."""
    n, heads, dim = k.shape
    if n:
        _kv_write_kernel[(n,)](k, v, k_dst, v_dst, streams, positions, k.stride(0), k.stride(1), v.stride(0),
                               v.stride(1), *k_dst.stride()[:3], *v_dst.stride()[:3], k_dst.shape[0],
                               k_dst.shape[1], heads, dim, BLOCK_H=triton.next_power_of_2(heads),
                               BLOCK_D=triton.next_power_of_2(dim))
