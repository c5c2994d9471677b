"""qmatmul_gpu's int8 tensor-core product: 2 to 16 rows of Q4_K and Q6_K (a Q4_K_M file's two formats).

The wide GEMV (_qmatmul_gpu_wide.py) multiplies each weight word once per row of x with dp4a: at 8
rows ~14 instructions a weight, 3.3-5.2x slower than cuBLAS on a dense copy (H200, docs/gpu.md).
Here x's q8_1 rows (_q8_1.py, padded to 16) meet each 32-value sub-block's unpacked
values in int8 tl.dots ([16, 32] x [32, BLOCK_N] -> int32: mma m16n8k32 on sm_80+), so a weight's
unpack (a mask or a shift a byte) is paid once for all rows, and the float scales (d * sc, dmin * m,
x's d and d * sum) are applied per sub-block and column after the dot. K is split over programs
(float32 partials summed by torch: qmatmul_gpu's `_output` / `_finish`) until ~MMA_PROGRAMS_PER_SM
programs an SM. Its floats are the wide GEMV's product in another summation order.
Serves from MMA_MIN_M rows (qmatmul_gpu's QMMA, default "int8" since an H200 run, 2026-11-28,
docs/gpu.md: Llama-8B's shape in Q4_K at b=8 6.9-7.2 ms a step against the wide GEMV's 19.5; per
matmul at 8 rows 1.9-4.5x the wide GEMV). Fewer rows take the wide GEMV, whose cost grows with the
rows (this product's does not: x is padded to 16); measured per matmul at 2, 3, 4 and 8 rows, the
int8 product wins from 3 rows of Q4_K (at 2 the wide GEMV is 1.2-1.6x faster on every Llama-8B
matmul); of Q6_K it wins at 8 and loses at 4 (qkv 63.3 against the wide GEMV's 60.7 us), so it takes
5-7 by interpolating the wide GEMV's growth (~6 us a row on that qkv).
A part of kernels/qmatmul_gpu.py (runtime/kernel_parts.py).
"""

from __future__ import annotations

import torch
import triton as _triton
import triton.language as tl

from slotserver.runtime import kernel_parts
from slotserver.runtime.qblocks import T, QWeight

_q8_1 = kernel_parts.load(__file__, "_q8_1.py")
_blocks = kernel_parts.load(__file__, "_qmatmul_gpu_blocks.py")
_f16, _f16w, _k4_scale = _blocks._f16, _blocks._f16w, _blocks._k4_scale

# weight rows (output columns) a program; ptxas, sm_90, 4 warps: Q4_K at 64 142 registers, Q6_K at 32
# 141 (at 64 its byte loads from 2-byte aligned blocks took 255), no spills
MMA_FORMATS = (T.Q4_K, T.Q6_K)   # what a Q4_K_M file holds (but its fallbacks for rows not of 256)
MMA_MIN_M = {T.Q4_K: 3, T.Q6_K: 5}   # fewer rows: the wide GEMV (module docstring)
MMA_MAX_M = 16                   # x is padded to 16 rows: tl.dot's smallest M
MMA_BLOCK_N = {T.Q4_K: 64, T.Q6_K: 32}
MMA_WARPS = 4
# K is split (float32 partials summed by torch) until about this many programs an SM. H200, 8 rows of
# Llama-8B's Q4_K, graph us (gpu_qmatmul_bench --tune): gate_up 77.4 at 4 against 88.5 at 2 (the best,
# 128 columns at 1 a SM, 77.1), down 44.7 against 47.5 (the best); 8 warps lost everywhere.
MMA_PROGRAMS_PER_SM = 4


@_triton.jit
def _mma_q4k_sb(acc, wb_ptr, ww_ptr, rbyte, rmask, xq_ptr, xd_ptr, xs_ptr, ms, mmask, j, sb, K):
    """acc [16, BN] += x's q8_1 rows times Q4_K super-block sb of the rows at bytes rbyte (words ww_ptr
    for d, dmin and the scales). Chunk c: 32 bytes, sub-block 2c in the low nibbles, 2c + 1 in the high."""
    w4 = ww_ptr + (rbyte + sb * 144) // 4                                            # [BN] int32 pointers
    hdr = tl.load(w4, mask=rmask, other=0)
    s0 = tl.load(w4 + 1, mask=rmask, other=0)
    s1 = tl.load(w4 + 2, mask=rmask, other=0)
    s2 = tl.load(w4 + 3, mask=rmask, other=0)
    d, dmin = _f16w(hdr), _f16w(hdr >> 16)
    for c in tl.static_range(4):
        qs = tl.load(wb_ptr + rbyte[None, :] + sb * 144 + 16 + c * 32 + j[:, None], mask=rmask[None, :], other=0)  # [32, BN]
        xrow = xq_ptr + ms[:, None] * K + sb * 256 + c * 64 + j[None, :]                                          # [16, 32]
        lo = tl.dot(tl.load(xrow, mask=mmask[:, None], other=0), (qs & 15).to(tl.int8), out_dtype=tl.int32)
        hi = tl.dot(tl.load(xrow + 32, mask=mmask[:, None], other=0), (qs >> 4).to(tl.int8), out_dtype=tl.int32)
        sc_lo, mn_lo = _k4_scale(s0, s1, s2, 2 * c)
        sc_hi, mn_hi = _k4_scale(s0, s1, s2, 2 * c + 1)
        xb = ms * (K // 32) + sb * 8 + 2 * c                                        # [16] x's block of sub-block 2c
        xd_lo, xd_hi = tl.load(xd_ptr + xb, mask=mmask, other=0.0), tl.load(xd_ptr + xb + 1, mask=mmask, other=0.0)
        xs_lo, xs_hi = tl.load(xs_ptr + xb, mask=mmask, other=0.0), tl.load(xs_ptr + xb + 1, mask=mmask, other=0.0)
        acc += xd_lo[:, None] * (d * sc_lo)[None, :] * lo.to(tl.float32) \
            + xd_hi[:, None] * (d * sc_hi)[None, :] * hi.to(tl.float32) \
            - xs_lo[:, None] * (dmin * mn_lo)[None, :] - xs_hi[:, None] * (dmin * mn_hi)[None, :]
    return acc


@_triton.jit
def _mma_q6k_sb(acc, wb_ptr, rbyte, rmask, xq_ptr, xd_ptr, ms, mmask, j, sb, K):
    """acc [16, BN] += x's q8_1 rows times Q6_K super-block sb (210 bytes: ql[128], qh[64], i8
    scales[16], d; 2-byte aligned, so byte loads). Sub-block s (half s // 4, quarter t = s % 4): 6-bit
    values (ql nibble t // 2 of bytes 64 half + 32 (t % 2) + l, qh bits 2t.. of bytes 128 + 32 half + l)
    minus 32, as int8; its two 16-value scales take two dots, x's other half zeroed in each, summed
    in int32 (|sum| < 2^24) before one float scaling."""
    blk = wb_ptr + rbyte + sb * 210                                                  # [BN] byte pointers
    d = _f16(blk + 208, rmask)
    for s in range(8):   # a loop, not unrolled: 8 sub-blocks' loads hoisted at once took 255 registers and spilled
        ql = tl.load(blk[None, :] + 64 * (s // 4) + 32 * (s % 2) + j[:, None], mask=rmask[None, :], other=0)  # [32, BN]
        qh = tl.load(blk[None, :] + 128 + 32 * (s // 4) + j[:, None], mask=rmask[None, :], other=0)
        q = (((ql >> (4 * ((s % 4) // 2))) & 15) | (((qh >> (2 * (s % 4))) & 3) << 4)).to(tl.int8) - 32
        x = tl.load(xq_ptr + ms[:, None] * K + sb * 256 + s * 32 + j[None, :], mask=mmask[:, None], other=0)  # [16, 32]
        first = (j < 16)[None, :]
        dot_a = tl.dot(tl.where(first, x, 0).to(tl.int8), q, out_dtype=tl.int32)
        dot_b = tl.dot(tl.where(first, 0, x).to(tl.int8), q, out_dtype=tl.int32)
        sc_a = tl.load(blk + 192 + 2 * s, mask=rmask, other=0).to(tl.int8, bitcast=True).to(tl.int32)
        sc_b = tl.load(blk + 193 + 2 * s, mask=rmask, other=0).to(tl.int8, bitcast=True).to(tl.int32)
        xd = tl.load(xd_ptr + ms * (K // 32) + sb * 8 + s, mask=mmask, other=0.0)
        acc += xd[:, None] * d[None, :] * (dot_a * sc_a[None, :] + dot_b * sc_b[None, :]).to(tl.float32)
    return acc


@_triton.jit
def _mma_kernel(xq_ptr, xd_ptr, xs_ptr, wb_ptr, ww_ptr, y_ptr, M, N, K, stride_w, stride_y, stride_s, sb_split,
                FMT: tl.constexpr, WU: tl.constexpr, ACC: tl.constexpr, BLOCK_N: tl.constexpr, SPLIT: tl.constexpr):
    """Program (column block, K split): 16 rows of q8_1 x (int8 [M, K], rows past M read as 0) times
    BLOCK_N rows of Q4_K (FMT 12) or Q6_K (14) at bytes wb_ptr (ww_ptr: the same storage as int32
    words, Q4_K's headers; stride_w in WU-byte units: Q4_K's 144-byte super-blocks keep its qs chunks
    16-byte aligned), super-blocks [ps * sb_split, (ps + 1) * sb_split). y [M, N] (+= if ACC), or
    float32 partials y[ps] where SPLIT."""
    pn, ps = tl.program_id(0), tl.program_id(1)
    rows = pn * BLOCK_N + tl.arange(0, BLOCK_N)
    rmask = rows < N
    rbyte = rows.to(tl.int64) * stride_w * WU                                        # [BN] row starts
    ms = tl.arange(0, 16)
    mmask = ms < M
    j = tl.arange(0, 32)
    acc = tl.zeros([16, BLOCK_N], dtype=tl.float32)
    for sb in range(ps * sb_split, tl.minimum((ps + 1) * sb_split, K // 256)):
        if FMT == 12:
            acc = _mma_q4k_sb(acc, wb_ptr, ww_ptr, rbyte, rmask, xq_ptr, xd_ptr, xs_ptr, ms, mmask, j, sb, K)
        else:
            acc = _mma_q6k_sb(acc, wb_ptr, rbyte, rmask, xq_ptr, xd_ptr, ms, mmask, j, sb, K)
    omask = mmask[:, None] & rmask[None, :]
    if SPLIT:
        tl.store(y_ptr + ps * stride_s + ms[:, None] * stride_y + rows[None, :], acc, mask=omask)
    else:
        out = y_ptr + ms[:, None] * stride_y + rows[None, :]
        if ACC:
            acc += tl.load(out, mask=omask, other=0.0).to(tl.float32)
        tl.store(out, acc.to(y_ptr.dtype.element_ty), mask=omask)


def mma_plan(n: int, k: int, sms: int, block_n: int) -> tuple[int, int, int]:
    """(column blocks, super-blocks a K split, splits): K split until about MMA_PROGRAMS_PER_SM programs
    an SM, each split at least 2 super-blocks. None depends on M, so a row's float sums do not either
    (within 2..MMA_MAX_M rows: x is always 16 rows, the dot's shape fixed)."""
    tiles, nsb = -(-n // block_n), k // 256
    want = -(-(MMA_PROGRAMS_PER_SM * sms) // tiles)          # splits that would fill the card
    sb_split = max(1, min(nsb, max(2, nsb // want)))
    return tiles, sb_split, -(-nsb // sb_split)



def reads(x: torch.Tensor, w: QWeight) -> bool:
    """The int8 product serves this one: Q4_K (16-byte aligned rows) or Q6_K, MMA_MIN_M..MMA_MAX_M rows."""
    return w.qtype in MMA_FORMATS and MMA_MIN_M[w.qtype] <= x.shape[0] <= MMA_MAX_M and w.n > 0 \
        and (w.qtype == T.Q6_K or (w.raw.stride(0) % 16 == 0 and w.raw.data_ptr() % 16 == 0))


def splits(m: int, n: int, k: int, qtype: int, sms: int) -> int:
    """The K splits `launch` writes float32 partials for (1: none)."""
    return mma_plan(n, k, sms, MMA_BLOCK_N[qtype])[2]


def launch(x: torch.Tensor, w: QWeight, y: torch.Tensor, fused: bool, sms: int, x_q8: tuple | None = None) -> None:
    """x quantized to q8_1 (one launch), the int8 dots into y (one launch; + y where `fused`, or
    float32 partials [split, M, N])."""
    m, n = x.shape[0], w.n
    xq, xd, xs = _q8_1.q8_1(x) if x_q8 is None else x_q8   # x_q8: the caller's (qmatmul_gpu FUSES)
    tiles, sb_split, split = mma_plan(n, w.k, sms, MMA_BLOCK_N[w.qtype])
    q4k = w.qtype == T.Q4_K
    wu = 16 if q4k else 1
    _mma_kernel[(tiles, split)](xq, xd, xs, w.raw, w.raw.view(torch.int32) if q4k else w.raw, y, m, n, w.k,
                                w.raw.stride(0) // wu, y.stride(-2), y.stride(0) if split > 1 else 0, sb_split,
                                FMT=int(w.qtype), WU=wu, ACC=fused, BLOCK_N=MMA_BLOCK_N[w.qtype], SPLIT=split > 1,
                                num_warps=MMA_WARPS)


def _mma_aot(qtype: T) -> tuple:
    """The int8 tensor-core product as `_mma` launches it for Llama-8B's wo (4096 x 4096, split K) on an
    H100; pointers 16-byte aligned as the JIT sees torch's tensors (Q6_K's rows are 2-byte aligned)."""
    q4k = qtype == T.Q4_K
    sig = {"xq_ptr": "*i8", "xd_ptr": "*fp32", "xs_ptr": "*fp32", "wb_ptr": "*u8", "ww_ptr": "*i32" if q4k else "*u8",
           "y_ptr": "*fp32", "M": "i32", "N": "i32", "K": "i32", "stride_w": "i32", "stride_y": "i32", "stride_s": "i32",
           "sb_split": "i32", "FMT": "constexpr", "WU": "constexpr", "ACC": "constexpr", "BLOCK_N": "constexpr",
           "SPLIT": "constexpr"}
    aligned = ("xq_ptr", "xd_ptr", "xs_ptr", "y_ptr", "K") + (("wb_ptr", "ww_ptr") if q4k else ())
    return (_mma_kernel, sig, dict(FMT=int(qtype), WU=16 if q4k else 1, ACC=False, BLOCK_N=MMA_BLOCK_N[qtype], SPLIT=True),
            {"num_warps": MMA_WARPS, "aligned": aligned})



AOT = [_mma_aot(t) for t in MMA_FORMATS]
