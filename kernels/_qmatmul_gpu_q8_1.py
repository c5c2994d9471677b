"""x quantized to q8_1 for qmatmul_gpu's integer products (the wide GEMV, the int8 tensor-core product).

q8_1 is llama.cpp's activation format for its CUDA mmvq / mmq: per 32 values of a row, int8 q =
round(x / d) with d = max|x| / 127, and the floats d and d * sum(q) (what the mins of Q4_K, Q5_K,
Q4_1 and Q5_1 multiply). Quantizing x costs one launch per matmul and ~1.1 bytes a value; it is what
lets a weight meet 4 activations in one dp4a (or 32 in one int8 mma) instead of 4 float FMAs.
A part of kernels/qmatmul_gpu.py (runtime/kernel_parts.py).
"""

from __future__ import annotations

import torch
import triton as _triton
import triton.language as tl

QUANT_BLOCKS = 32      # 32-value blocks of x a quantizing program handles


@_triton.jit
def _q8_1_kernel(x_ptr, q_ptr, d_ptr, s_ptr, K, stride_x, QB: tl.constexpr):
    """Program (row m, QB blocks of 32): d = max|x| / 127, q = x / d rounded to nearest even (int8),
    s = d * sum(q) (the dequantized block's sum, for Q4_K's mins)."""
    m = tl.program_id(0).to(tl.int64)
    b = tl.program_id(1) * QB + tl.arange(0, QB)
    off = b[:, None] * 32 + tl.arange(0, 32)[None, :]                                        # [QB, 32]
    bmask = b < K // 32
    x = tl.load(x_ptr + m * stride_x + off, mask=bmask[:, None], other=0.0).to(tl.float32)
    amax = tl.max(tl.abs(x), axis=1)
    inv = tl.where(amax > 0, 127.0 / tl.where(amax > 0, amax, 1.0), 0.0)
    r = x * inv[:, None] + 12582912.0    # + 1.5 * 2^23: the float add rounds to an integer, ties to even
    q = r.to(tl.int32, bitcast=True) - 0x4B400000
    d = amax / 127.0
    tl.store(q_ptr + m * K + off, q.to(tl.int8), mask=bmask[:, None])
    tl.store(d_ptr + m * (K // 32) + b, d, mask=bmask)
    tl.store(s_ptr + m * (K // 32) + b, d * tl.sum(q, axis=1).to(tl.float32), mask=bmask)


def q8_1(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x [M, K] (K a multiple of 32) -> (int8 q [M, K], float d [M, K/32], float s [M, K/32]), one launch."""
    m, k = x.shape
    q = torch.empty(m, k, dtype=torch.int8, device=x.device)
    d, s = (torch.empty(m, k // 32, dtype=torch.float32, device=x.device) for _ in range(2))
    if m and k:
        _q8_1_kernel[(m, _triton.cdiv(k // 32, QUANT_BLOCKS))](x, q, d, s, k, x.stride(0), QB=QUANT_BLOCKS)
    return q, d, s



# ptxas, sm_90, triton 3.9: 38 registers, no spills
AOT = [(_q8_1_kernel, {"x_ptr": "*bf16", "q_ptr": "*i8", "d_ptr": "*fp32", "s_ptr": "*fp32", "K": "i32", "stride_x": "i32",
                       "QB": "constexpr"}, {"QB": QUANT_BLOCKS}, {"aligned": ("x_ptr", "q_ptr", "d_ptr", "s_ptr")})]
