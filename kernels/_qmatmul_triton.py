"""kernels/qmatmul.py's Triton product (`triton()`: the fusions around it are in torch there): a
tl.dot per 32-value block, Q8_0 and Q4_0 dequantized in the kernel, other formats on the host. Not
what serves GGUF blocks on a GPU (kernels/qmatmul_gpu.py does, every format in the kernel): this is
the op's contract on Triton, checked by the lab like every kernel's. A part of qmatmul.py
(runtime/kernel_parts.py).
"""

from __future__ import annotations

import torch
import triton as _triton
import triton.language as tl

from slotserver.runtime.qblocks import FLOATS, T, QWeight, dequantize

# Triton: Q8_0 and Q4_0 dequantized in-kernel (QTYPE), any other format dequantized on the host and
# multiplied by the same kernel in float mode (QTYPE 0: w is a float [N, K] tensor).
@_triton.jit
def _qmatmul_kernel(x_ptr, w_ptr, y_ptr, M, N, K, stride_x, stride_w, stride_y,
                    QTYPE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """One program per [BLOCK_M, BLOCK_N] output tile; K in steps of 32 (one quant block)."""
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    j = tl.arange(0, 32)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for kb in range(0, tl.cdiv(K, 32)):
        k = kb * 32 + j
        xt = tl.load(x_ptr + offs_m[:, None].to(tl.int64) * stride_x + k[None, :],
                     mask=(offs_m[:, None] < M) & (k[None, :] < K), other=0.0).to(tl.float32)   # [BM, 32]
        rows = w_ptr + offs_n[:, None].to(tl.int64) * stride_w
        nmask = offs_n[:, None] < N
        if QTYPE == 0:
            wt = tl.load(rows + k[None, :], mask=nmask & (k[None, :] < K), other=0.0).to(tl.float32)
        else:
            blk = rows + kb * (34 if QTYPE == 8 else 18)                                          # [BN, 1]
            lo = tl.load(blk, mask=nmask, other=0).to(tl.uint16)
            hi = tl.load(blk + 1, mask=nmask, other=0).to(tl.uint16)
            d = (lo | (hi << 8)).to(tl.float16, bitcast=True).to(tl.float32)                       # [BN, 1]
            if QTYPE == 8:
                q = tl.load(blk + 2 + j[None, :], mask=nmask, other=0).to(tl.int8, bitcast=True).to(tl.float32)
            else:
                b = tl.load(blk + 2 + (j[None, :] % 16), mask=nmask, other=0).to(tl.int32)
                q = ((b >> (4 * (j[None, :] // 16))) & 15).to(tl.float32) - 8.0
            wt = q * d                                                                           # [BN, 32]
        acc += tl.dot(xt, tl.trans(wt))
    tl.store(y_ptr + offs_m[:, None].to(tl.int64) * stride_y + offs_n[None, :], acc.to(y_ptr.dtype.element_ty),
             mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))


TRITON_BLOCK_M, TRITON_BLOCK_N = 16, 32


def launch(x: torch.Tensor, w: QWeight) -> torch.Tensor:
    """x [M, K] (unit last stride) times w -> [M, N] in x's dtype: Q8_0 and Q4_0 read in the kernel,
    every other format dequantized on the host (gguf's) and multiplied in the kernel's float mode."""
    assert x.dim() == 2 and x.stride(1) == 1 and x.shape[1] == w.k
    y = torch.empty(x.shape[0], w.n, dtype=x.dtype, device=x.device)
    if w.qtype in (T.Q8_0, T.Q4_0):
        wt, qtype = w.raw, int(w.qtype)
    else:   # host dequantization (gguf's), then the kernel's float mode
        wt = (w.float_view() if w.qtype in FLOATS else dequantize(w)).to(x.device).contiguous()
        qtype = 0
    if x.shape[0] and w.n:
        grid = (_triton.cdiv(x.shape[0], TRITON_BLOCK_M), _triton.cdiv(w.n, TRITON_BLOCK_N))
        _qmatmul_kernel[grid](x, wt, y, x.shape[0], w.n, w.k, x.stride(0), wt.stride(0), y.stride(0),
                              QTYPE=qtype, BLOCK_M=TRITON_BLOCK_M, BLOCK_N=TRITON_BLOCK_N)
    return y


def _aot(qtype: int, x: str, w: str) -> tuple:
    sig = {"x_ptr": f"*{x}", "w_ptr": f"*{w}", "y_ptr": f"*{x}", "M": "i32", "N": "i32", "K": "i32",
           "stride_x": "i32", "stride_w": "i32", "stride_y": "i32", "QTYPE": "constexpr",
           "BLOCK_M": "constexpr", "BLOCK_N": "constexpr"}
    return (_qmatmul_kernel, sig, {"QTYPE": qtype, "BLOCK_M": TRITON_BLOCK_M, "BLOCK_N": TRITON_BLOCK_N})



AOT = [_aot(8, "bf16", "u8"), _aot(2, "bf16", "u8"), _aot(2, "fp32", "u8"), _aot(0, "fp32", "fp32")]
