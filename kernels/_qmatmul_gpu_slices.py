"""qmatmul_gpu's slices kernel: every format, 32 weight values dequantized to float32 at a time
(`_dequant32`) and multiplied in float32 registers or by tl.dot; and W dequantized tile by tile for
cuBLAS from DEQUANT_GEMM_ROWS rows (prefill). What serves the formats and row counts the wide GEMV
and the int8 product do not (MXFP4, 9-16 rows, SLOTSERVER_QGEMV=slices), and every prefill.

Regimes (`_qmm_kernel`'s tile sizes are its constexprs, `plan` picks them):
- decode (M <= SMALL_M): one row (b=1) as a GEMV (BLOCK_M = 1: the dequantized [64, 32] slice
  times x summed in registers; a tl.dot would first shuffle the slice through shared memory into
  the MMA operand layout, for 1 useful row in 16); 2-16 rows with BLOCK_M = 16 (tl.dot's smallest;
  rows past M are masked) and 32-column blocks; both with K split over a third grid axis
  (`SPLIT_K` programs per column block, each a contiguous range of blocks, until about
  PROGRAMS_PER_SM programs per SM) so that a [1, 4864] x [4864, 896] call still spreads over every
  SM; every weight byte is read once per call. Split partials go to a float32 [SPLIT_K, M, N]
  buffer summed by torch (qmatmul_gpu's `_output` / `_finish`). A row's floats are the same at
  every M within one regime (the split depends on N and K only), not across regimes (the GEMV sums
  in another order): batch-invariant as far as cuBLAS on a dense copy is, which picks its kernel by M too.
- 17 to DEQUANT_GEMM_ROWS - 1 rows (the GEMM; none while DEQUANT_GEMM_ROWS is 17): 64 x 64 tiles,
  K inside, each program dequantizing a [64, 32] weight slice into registers per step for one
  tl.dot; the slice is re-read by every M tile (from L2: a Llama-8B layer matmul is 10-60 MB of
  blocks, and at large M the product is compute-bound).
- from DEQUANT_GEMM_ROWS rows (prefill): W dequantized to x's dtype a tile at a time by
  `_dequant_kernel` (the same `_dequant32`), multiplied by cuBLAS (`dequant_gemm`).
The tile constants were chosen by ptxas's register counts (below; `playground/gpu_qmatmul_bench.py
--tune` sweeps them on a card). A part of kernels/qmatmul_gpu.py (runtime/kernel_parts.py).
"""

from __future__ import annotations

import torch
import triton as _triton
import triton.language as tl

from slotserver.runtime import kernel_parts
from slotserver.runtime.gpu_info import interpreted
from slotserver.runtime.qblocks import T, QWeight

_blocks = kernel_parts.load(__file__, "_qmatmul_gpu_blocks.py")
_dequant32 = _blocks._dequant32

FORMATS = (T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.Q4_K, T.Q5_K, T.Q6_K, T.MXFP4)   # every one qmatmul_gpu serves
SMALL_M = 16                       # rows up to which the decode regime serves
DECODE_BLOCK_N, GEMM_BLOCK_M, GEMM_BLOCK_N = 32, 64, 64
GEMV_BLOCK_N = 64                  # one row (decode b=1): no tl.dot, wider column blocks
PROGRAMS_PER_SM = 4                # the decode regime splits K until about this many programs per SM
# rows from which W is dequantized tile by tile for cuBLAS (dequant_gemm). Was 128; on an H100
# (2026-11-27, docs/gpu.md) dequantize + cuBLAS beat the 64x64 tiled GEMM at 32 and 64 rows on 7 of 10
# Qwen2.5-0.5B / Llama-8B shapes (Qwen down 15 vs 73 us, Llama wo 38 vs 81 us): the GEMM tiling is
# kept in `plan` for lab edits that raise this, but serves no row count now.
DEQUANT_GEMM_ROWS = 17
DEQUANT_TILE_VALUES = 1 << 24      # weight values dequantized at once there (32 MB in bf16)
# GEMM warps: with 4, ptxas (sm_90) gives the 64 x 64 tile 227-255 registers a thread (one block per
# SM); with 8, 122-164, no spills either way (`slotserver lab check` prints them)
GEMM_WARPS, DECODE_WARPS = 8, 4
GEMV_WARPS = 8   # the [64, 32] GEMV tile: 64-124 registers, no spills (4 warps: up to 217)
MIN_SPLIT_BLOCKS = 8               # 32-value slices a decode program reads at least (256 values)


@_triton.jit
def _qmm_kernel(x_ptr, w_ptr, y_ptr, M, N, K, stride_x, stride_w, stride_y, stride_split,
                FMT: tl.constexpr, ACC: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                SPLIT_K: tl.constexpr, IEEE_DOT: tl.constexpr):
    """Program (m tile, n tile, k split): y[m, n] (+= where ACC) over its split's 32-value slices;
    y is the split's [M, N] plane (stride_split apart) when SPLIT_K > 1."""
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    j = tl.arange(0, 32)[None, :]
    rows = w_ptr + offs_n[:, None].to(tl.int64) * stride_w                                    # [BN, 1]
    nmask = offs_n[:, None] < N
    mmask = offs_m[:, None] < M
    xrows = x_ptr + offs_m[:, None].to(tl.int64) * stride_x                                   # [BM, 1]
    nkb = K // 32
    per = tl.cdiv(nkb, SPLIT_K)
    kb0 = tl.program_id(2) * per
    kb1 = tl.minimum(nkb, kb0 + per)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for kb in range(kb0, kb1):
        xt = tl.load(xrows + kb * 32 + j, mask=mmask, other=0.0)                             # [BM, 32]
        wt = _dequant32(rows, kb, j, nmask, FMT)                                             # [BN, 32]
        if BLOCK_M == 1:   # GEMV: products and row sums in registers, no MMA operand shuffle
            acc += tl.sum(wt * xt.to(tl.float32), axis=1)[None, :]
        elif IEEE_DOT:   # float32 x (exact, no tf32), and the interpreter (its bf16 dot multiplies bit patterns)
            acc += tl.dot(xt.to(tl.float32), tl.trans(wt), input_precision="ieee")
        else:          # bf16 x: the weight rounded to bf16 as a dense copy is, tensor-core MMA
            acc += tl.dot(xt, tl.trans(wt.to(xt.dtype)))
    out = y_ptr + tl.program_id(2).to(tl.int64) * stride_split + offs_m[:, None].to(tl.int64) * stride_y \
        + offs_n[None, :]
    omask = mmask & (offs_n[None, :] < N)
    if ACC:
        acc += tl.load(out, mask=omask, other=0.0).to(tl.float32)
    tl.store(out, acc.to(y_ptr.dtype.element_ty), mask=omask)


@_triton.jit
def _dequant_kernel(w_ptr, out_ptr, N, stride_w, stride_o, FMT: tl.constexpr, BLOCK_N: tl.constexpr):
    """Program (row block, 32-value slice kb): W[rows, kb*32 + 0..31] dequantized into out."""
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    kb = tl.program_id(1)
    j = tl.arange(0, 32)[None, :]
    nmask = offs_n[:, None] < N
    wt = _dequant32(w_ptr + offs_n[:, None].to(tl.int64) * stride_w, kb, j, nmask, FMT)           # [BN, 32]
    tl.store(out_ptr + offs_n[:, None].to(tl.int64) * stride_o + kb * 32 + j, wt.to(out_ptr.dtype.element_ty),
             mask=nmask)


def dequant_gemm(x: torch.Tensor, w: QWeight, acc: torch.Tensor | None) -> torch.Tensor:
    """Many rows (prefill): W dequantized to x's dtype DEQUANT_TILE_VALUES at a time, each tile
    multiplied by cuBLAS. Why: from ~a hundred rows the product is compute-bound and cuBLAS's GEMM
    beats a tile loop that dequantizes in its inner step (re-done for every row tile); writing
    and re-reading one bf16 tile costs ~2 bytes a weight once per call (llama.cpp's CUDA backend
    does the same for large batches). The numerics are the dense path's: bf16 weights, cuBLAS."""
    rows = max(16, DEQUANT_TILE_VALUES // w.k)
    tile = torch.empty(min(rows, w.n), w.k, dtype=x.dtype, device=x.device)                   # [rows, K]
    y = torch.empty(x.shape[0], w.n, dtype=x.dtype, device=x.device) if acc is None else acc
    for n0 in range(0, w.n, rows):
        n1 = min(w.n, n0 + rows)
        _dequant_kernel[(_triton.cdiv(n1 - n0, 64), w.k // 32)](w.raw[n0:n1], tile, n1 - n0, w.raw.stride(0),
                                                                tile.stride(0), FMT=int(w.qtype), BLOCK_N=64)
        part = x @ tile[: n1 - n0].T                                                          # [M, rows]
        if acc is None:
            y[:, n0:n1] = part
        else:
            y[:, n0:n1] += part
    return y


def plan(m: int, n: int, k: int, sms: int) -> tuple[int, int, int, int]:
    """(BLOCK_M, BLOCK_N, SPLIT_K, num_warps) for an [m, k] x [k, n] product on a card of `sms` SMs: the
    decode regime splits K until ~4 programs per SM (each reading >= MIN_SPLIT_BLOCKS slices)."""
    if m > SMALL_M:
        return GEMM_BLOCK_M, GEMM_BLOCK_N, 1, GEMM_WARPS
    bm, bn, warps = (1, GEMV_BLOCK_N, GEMV_WARPS) if m == 1 else (16, DECODE_BLOCK_N, DECODE_WARPS)
    tiles = _triton.cdiv(n, bn)
    split = max(1, min(_triton.cdiv(PROGRAMS_PER_SM * sms, tiles), (k // 32) // MIN_SPLIT_BLOCKS))
    return bm, bn, split, warps



def splits(m: int, n: int, k: int, qtype: int, sms: int) -> int:
    """The K splits `launch` writes partials for (qmatmul_gpu's `_output`)."""
    return plan(m, n, k, sms)[2]


def launch(x: torch.Tensor, w: QWeight, y: torch.Tensor, fused: bool, sms: int, x_q8: tuple | None = None) -> None:
    """`_qmm_kernel` into y: x's product (+ y where `fused`), or float32 K-split partials [split, M, N]
    (x_q8 unread: this product multiplies x itself)."""
    m, n = x.shape[0], w.n
    bm, bn, split, warps = plan(m, n, w.k, sms)
    grid = (_triton.cdiv(m, bm), _triton.cdiv(n, bn), split)
    _qmm_kernel[grid](x, w.raw, y, m, n, w.k, x.stride(0), w.raw.stride(0), y.stride(-2),
                      y.stride(0) if split > 1 else 0, FMT=int(w.qtype), ACC=fused,
                      BLOCK_M=bm, BLOCK_N=bn, SPLIT_K=split,
                      IEEE_DOT=x.dtype == torch.float32 or interpreted(), num_warps=warps)


def _aot(fmt: int, x: str, decode: bool, acc: bool = False, gemv: bool = False) -> tuple:
    sig = {"x_ptr": f"*{x}", "w_ptr": "*u8", "y_ptr": "*fp32" if acc or decode else f"*{x}", "M": "i32", "N": "i32",
           "K": "i32", "stride_x": "i32", "stride_w": "i32", "stride_y": "i32", "stride_split": "i32",
           "FMT": "constexpr", "ACC": "constexpr", "BLOCK_M": "constexpr", "BLOCK_N": "constexpr",
           "SPLIT_K": "constexpr", "IEEE_DOT": "constexpr"}
    tiles = dict(BLOCK_M=1, BLOCK_N=GEMV_BLOCK_N, SPLIT_K=4) if gemv else \
        dict(BLOCK_M=16, BLOCK_N=DECODE_BLOCK_N, SPLIT_K=4) if decode else \
        dict(BLOCK_M=GEMM_BLOCK_M, BLOCK_N=GEMM_BLOCK_N, SPLIT_K=1)
    warps = GEMV_WARPS if gemv else DECODE_WARPS if decode else GEMM_WARPS
    return (_qmm_kernel, sig, {"FMT": fmt, "ACC": acc, "IEEE_DOT": False, **tiles}, {"num_warps": warps})


# Every format as the one-row GEMV (what serves at b=1), the Q4_K_M pair also in the 2-16 row dot
# regime and the GEMM (the same _dequant32 code; each spec costs the suite ~1 s a GPU architecture).
# ptxas, sm_90, triton 3.9: GEMV (8 warps) 64-124 registers; 2-16 rows (4 warps) 96-141, 2-3 KB shared;
# GEMM (8 warps) Q4_K 164, Q6_K 128, Q8_0 122 (4 warps: 227-255); no spills.
AOT = [_aot(int(t), "bf16", True, gemv=True) for t in FORMATS] + \
      [_aot(int(t), "bf16", True) for t in (T.Q4_K, T.Q6_K)] + \
      [_aot(int(t), "bf16", False, acc=t == T.Q4_K) for t in (T.Q4_K, T.Q6_K)] + \
      [(_dequant_kernel, {"w_ptr": "*u8", "out_ptr": "*bf16", "N": "i32", "stride_w": "i32", "stride_o": "i32",
                          "FMT": "constexpr", "BLOCK_N": "constexpr"}, {"FMT": int(t), "BLOCK_N": 64})
       for t in (T.Q4_K, T.Q6_K)]

