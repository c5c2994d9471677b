"""x quantized to q8_1 for qmatmul_gpu's integer products (the wide GEMV, the int8 tensor-core product).

q8_1 is llama.cpp's activation format for its CUDA mmvq / mmq: per 32 values of a row, int8 q =
round(x / d) with d = max|x| / 127, and the floats d and d * sum(q) (what the mins of Q4_K, Q5_K,
Q4_1 and Q5_1 multiply). Quantizing x costs one launch per matmul and ~1.1 bytes a value; it is what
lets a weight meet 4 activations in one dp4a (or 32 in one int8 mma) instead of 4 float FMAs.
A part of kernels/qmatmul_gpu.py, rms_norm.py and silu_mul.py (runtime/kernel_parts.py): the `q8_1`
fusion of rms_norm and silu_mul writes the q8_1 of the rows they store with the same `_quantize32`,
so a matmul given them (qmatmul_gpu's `x_q8`) reads the very values it would have quantized itself,
one launch fewer.
"""

from __future__ import annotations

import torch
import triton as _triton
import triton.language as tl

QUANT_BLOCKS = 32      # 32-value blocks of x a quantizing program handles


@_triton.jit
def _q8_1_kernel(x_ptr, q_ptr, d_ptr, s_ptr, K, stride_x, QB: tl.constexpr):
    """Program (row m, QB blocks of 32): x's blocks quantized (`_quantize32`), q stored as int8."""
    m = tl.program_id(0).to(tl.int64)
    b = tl.program_id(1) * QB + tl.arange(0, QB)
    off = b[:, None] * 32 + tl.arange(0, 32)[None, :]                                        # [QB, 32]
    bmask = b < K // 32
    x = tl.load(x_ptr + m * stride_x + off, mask=bmask[:, None], other=0.0).to(tl.float32)
    _quantize_into(x, q_ptr + m * K + off, d_ptr + m * (K // 32) + b, s_ptr + m * (K // 32) + b, bmask)


@_triton.jit
def _quantize_into(x, q_ptrs, d_ptrs, s_ptrs, bmask):
    """x float32 [QB, 32] quantized (`_quantize32`) and stored: q as int8 at q_ptrs [QB, 32], d and s
    at d_ptrs / s_ptrs [QB], the blocks where bmask [QB]. Every kernel that writes q8_1 calls it."""
    q, d, s = _quantize32(x)
    tl.store(q_ptrs, q.to(tl.int8), mask=bmask[:, None])
    tl.store(d_ptrs, d, mask=bmask)
    tl.store(s_ptrs, s, mask=bmask)


@_triton.jit
def _quantize32(x):
    """x float32 [QB, 32] -> (q int32 [QB, 32] in -127..127, d [QB], s [QB]): d = max|x| / 127, q =
    x / d rounded to nearest even, s = d * sum(q) (the dequantized block's sum, for Q4_K's mins).
    The one formula of q8_1 here: every kernel that quantizes calls it."""
    amax = tl.max(tl.abs(x), axis=1)
    inv = tl.where(amax > 0, 127.0 / tl.where(amax > 0, amax, 1.0), 0.0)
    r = x * inv[:, None] + 12582912.0    # + 1.5 * 2^23: the float add rounds to an integer, ties to even
    q = r.to(tl.int32, bitcast=True) - 0x4B400000
    d = amax / 127.0
    return q, d, d * tl.sum(q, axis=1).to(tl.float32)


def buffers(m: int, k: int, device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Empty q8_1 of m rows of k values: (int8 q [m, k], float32 d [m, k/32], float32 s [m, k/32])."""
    q = torch.empty(m, k, dtype=torch.int8, device=device)
    return (q, *(torch.empty(m, k // 32, dtype=torch.float32, device=device) for _ in range(2)))


def check(q8: tuple[torch.Tensor, ...], m: int, k: int, device) -> None:
    """`q8` is the q8_1 of m rows of k values as `buffers` makes it (contiguous, on `device`)."""
    assert k % 32 == 0, f"q8_1 takes rows of a multiple of 32 values, not {k}"
    q, d, s = q8
    assert q.dtype == torch.int8 and q.shape == (m, k) and d.shape == s.shape == (m, k // 32) \
        and d.dtype == s.dtype == torch.float32 and all(t.is_contiguous() and t.device == device for t in q8), \
        "q8_1 buffers must be int8 [m, k] and float32 [m, k / 32] twice, contiguous, on x's device"


def torch_q8_1(x: torch.Tensor, out: tuple[torch.Tensor, ...]) -> None:
    """`_quantize32` in torch (the references' form): x [M, K] -> out's (q, d, s) filled. round() is
    the kernel's ties-to-even; where a GPU contracts its multiply-add into one rounding, a q may
    differ by 1 from this (the kernels themselves all share `_quantize32`)."""
    check(out, *x.shape, x.device)
    v = x.float().reshape(x.shape[0], -1, 32)                                                  # [M, K/32, 32]
    amax = v.abs().amax(-1)
    inv = torch.where(amax > 0, 127.0 / torch.where(amax > 0, amax, torch.ones_like(amax)), torch.zeros_like(amax))
    q = torch.round(v * inv[..., None])
    d = amax / 127.0
    out[0].copy_(q.reshape(x.shape).to(torch.int8))
    out[1].copy_(d)
    out[2].copy_(d * q.sum(-1))


def q8_1(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x [M, K] (K a multiple of 32) -> (int8 q [M, K], float d [M, K/32], float s [M, K/32]), one launch."""
    m, k = x.shape
    q, d, s = buffers(m, k, x.device)
    if m and k:
        _q8_1_kernel[(m, _triton.cdiv(k // 32, QUANT_BLOCKS))](x, q, d, s, k, x.stride(0), QB=QUANT_BLOCKS)
    return q, d, s


# ptxas, triton 3.9: 40 registers on sm_80, 32 on sm_90, no spills
AOT = [(_q8_1_kernel, {"x_ptr": "*bf16", "q_ptr": "*i8", "d_ptr": "*fp32", "s_ptr": "*fp32", "K": "i32", "stride_x": "i32",
                       "QB": "constexpr"}, {"QB": QUANT_BLOCKS}, {"aligned": ("x_ptr", "q_ptr", "d_ptr", "s_ptr")})]
