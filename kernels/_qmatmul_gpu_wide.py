"""qmatmul_gpu's wide GEMV: llama.cpp's CUDA `mmvq` in Triton, for 1 to WIDE_MAX_M (8) rows of
WIDE_FORMATS (all of qmatmul_gpu's formats but MXFP4, whose 17-byte blocks are not word-aligned).

x is quantized once per call to q8_1 (_q8_1.py), each program reads R whole weight rows
as int32 words (Q4_K, Q5_K: the 128-byte qs arrays with 16-byte loads; the 2-byte aligned Q6_K /
Q8_0 / Q5_0 / Q4_0 blocks with a funnel shift of two words), unpacks nibbles with integer masks in
registers and multiplies 4 weights by 4 activations per PTX dp4a, summed in int32 and scaled once
per 32 (16 for Q6_K); the whole of K in one program (no split partials), the residual add in its
store. Its floats differ from the slices' by the 8-bit activation (as kernels/qmatmul.py on the
CPU), within qmatmul_gpu's TOL; a row's floats do not depend on M within 1..8 (wide_plan's STEP
ignores M and the partials are summed in a fixed tree, `_tree_sum`; tests/test_gpu_qgemv.py on a
card). On an H200, Q4_K at one row beats cuBLAS on the dense bf16 copy on every Llama-8B matmul
(docs/gpu.md); at 8 rows it does not (the int math of 8 rows per weight word: 198 registers a thread).
Serves by default (qmatmul_gpu's QGEMV; SLOTSERVER_QGEMV=slices for the slices kernel).

Why the q8_1 route and not float math after unpacking (docs/gpu.md, "Prepared on CPU, 2026-11-27"):
a GEMV at the H100's ~3 TB/s must retire ~20 Q4_K weights per clock per SM. Unpacked to floats, a
weight costs ~2 integer ops (shift, mask; 64/clk/SM) plus a conversion and one FMA per row: ~21
weights/clk at M=1 and ~10 at M=8, compute-bound below the bandwidth. With x quantized to int8 per
32 (q8_1, once per call), 4 weights cost ~1.5 integer ops plus one dp4a per row (64/clk/SM): ~27
weights/clk even at M=8, which is why llama.cpp's CUDA backend serves 1..8 rows with mmvq.
A part of kernels/qmatmul_gpu.py (runtime/kernel_parts.py).
"""

from __future__ import annotations

import gguf
import torch
import triton as _triton
import triton.language as tl

from slotserver.runtime import kernel_parts
from slotserver.runtime.gpu_info import interpreted
from slotserver.runtime.qblocks import T, QWeight

_q8_1 = kernel_parts.load(__file__, "_q8_1.py")
_blocks = kernel_parts.load(__file__, "_qmatmul_gpu_blocks.py")
_word, _f16w, _half, _spread, _signed, _k4_scale = \
    _blocks._word, _blocks._f16w, _blocks._half, _blocks._spread, _blocks._signed, _blocks._k4_scale

WIDE_FORMATS = (T.Q4_K, T.Q6_K, T.Q5_0, T.Q8_0, T.Q4_0, T.Q4_1, T.Q5_1, T.Q5_K)   # not MXFP4: 17-byte blocks
WIDE_MAX_M = 8
# Tuned on an H200 (2026-11-27, gpu_qmatmul_bench.py --tune, Llama-8B's gate|up and down in Q4_K, graph
# time): at one row 2048 words a step was 1.4-1.5x faster than 1024 (gate|up 34.4 against 48.5 us, down
# 14.4 against 22.0), 4 warps beat 8, 4 programs an SM tied or beat 1 and 2. 2048 words at 8 rows and
# 4 warps spill (ptxas, sm_90: Q4_K 304 bytes, Q5_0 436); at 8 warps each thread holds what it held at
# 1024 words and 4 warps (Q4_K 198 registers, no spills), hence more warps from 2 rows. STEP follows
# WIDE_WORDS only, never M (wide_plan); warps and R change the layout, not a row's float order (_tree_sum).
WIDE_WORDS = 2048      # weight words (int32) a program loads per K step: 16 a thread at 4 warps (wide_plan)
WIDE_WARPS = 4         # one row
WIDE_ROWS_WARPS = 8    # 2..WIDE_MAX_M rows
WIDE_PROGRAMS_PER_SM = 4   # rows per program (2..WIDE_ROWS) are halved until about this many programs per SM
WIDE_ROWS = 16             # the most rows a program (registers: see wide_plan)
# Interpreted (the CPU tests), a program costs the same Python at any R and programs run one by one:
# 128 rows cut those launches ~3x (R changes STEP, so a row's float order, still one at every M).
INTERPRETED_ROWS = 128


@_triton.jit
def _dp4a(a, b, ASM: tl.constexpr):
    """Sum of the products of the 4 signed bytes of a and b (int32, broadcast): PTX dp4a on the card,
    shifts under the interpreter (which runs no inline PTX)."""
    a, b = tl.broadcast(a, b)
    if ASM:
        out = tl.inline_asm_elementwise("dp4a.s32.s32 $0, $1, $2, $3;", "=r,r,r,r", [a, b, tl.zeros_like(a)],
                                        dtype=tl.int32, is_pure=True, pack=1)
    else:
        out = ((a << 24) >> 24) * ((b << 24) >> 24) + ((a << 16) >> 24) * ((b << 16) >> 24) \
            + ((a << 8) >> 24) * ((b << 8) >> 24) + (a >> 24) * (b >> 24)
    return out


@_triton.jit
def _per_row(xoff, roff):
    """x's row offsets [BM] as [BM, R, 1, 1, 1]: x loaded once per weight row too (same addresses: L1),
    so that its load gets the weight load's layout (warps across the R rows, x rows in registers) and
    the products need no layout conversion through shared memory (none left in the loop at one row
    but Q8_0's small one; at 8 rows the partials still convert: docs/gpu.md)."""
    return xoff[:, None, None, None, None] + 0 * roff[None, :, None, None, None]


@_triton.jit
def _q45k_step(w_ptr, roff, rmask, xq_ptr, xd_ptr, xs_ptr, xoff, soff, mmask, st, nsb, SB: tl.constexpr,
               FMT: tl.constexpr, ASM: tl.constexpr):
    """Q4_K (144 bytes: d, dmin, scales[12], qs[128]) or Q5_K (176: the same with qh[32] before qs)
    super-blocks st*SB.. of R rows against BM rows of q8_1 x -> float [BM, R, SB, 4]. qs word (c, i)
    holds sub-block 2c's values 4i..4i+3 in its low nibbles, 2c+1's in its high ones (Q5_K: their
    fifth bits are bits 2c, 2c+1 of qh word i's bytes): 16-byte-aligned [R, SB, 4, 8] loads of whole
    128-byte qs arrays."""
    WORDS = 36 if FMT == 12 else 44   # a super-block's int32 words
    QS = 4 if FMT == 12 else 12       # its qs array's first word
    sb, c, i = st * SB + tl.arange(0, SB), tl.arange(0, 4), tl.arange(0, 8)
    sb5, c5, i5 = sb[None, None, :, None, None], c[None, None, None, :, None], i[None, None, None, None, :]
    wmask = rmask[None, :, None, None, None] & (sb5 < nsb)
    wrow = w_ptr + roff[None, :, None, None, None] + sb5 * WORDS
    qs = tl.load(wrow + QS + c5 * 8 + i5, mask=wmask, other=0)                                # [1, R, SB, 4, 8]
    q_lo, q_hi = qs & 0x0F0F0F0F, (qs >> 4) & 0x0F0F0F0F
    if FMT == 13:
        qh = tl.load(wrow + 4 + i5 + 0 * c5, mask=wmask, other=0)   # [1, R, SB, 4, 8]: qs's layout, no conversion
        q_lo |= ((qh >> (2 * c5)) & 0x01010101) << 4
        q_hi |= ((qh >> (2 * c5 + 1)) & 0x01010101) << 4
    xw = xq_ptr + _per_row(xoff, roff) + sb5 * 64 + c5 * 16 + i5                            # [BM, R, SB, 4, 8]
    xmask = mmask[:, None, None, None, None] & (sb5 < nsb)
    lo = tl.sum(_dp4a(q_lo, tl.load(xw, mask=xmask, other=0), ASM), axis=4)                 # [BM, R, SB, 4]
    hi = tl.sum(_dp4a(q_hi, tl.load(xw + 8, mask=xmask, other=0), ASM), axis=4)
    sb4, c4 = sb[None, None, :, None], c[None, None, None, :]
    w4, m4 = w_ptr + roff[None, :, None, None] + sb4 * WORDS, rmask[None, :, None, None] & (sb4 < nsb)
    hdr = tl.load(w4, mask=m4, other=0)                                                      # [1, R, SB, 1]
    s0, s1, s2 = tl.load(w4 + 1, mask=m4, other=0), tl.load(w4 + 2, mask=m4, other=0), tl.load(w4 + 3, mask=m4, other=0)
    sc_lo, mn_lo = _k4_scale(s0, s1, s2, 2 * c4)
    sc_hi, mn_hi = _k4_scale(s0, s1, s2, 2 * c4 + 1)
    xs4, xm4 = soff[:, None, None, None] + sb4 * 8 + 2 * c4, mmask[:, None, None, None] & (sb4 < nsb)
    xd_lo, xd_hi = tl.load(xd_ptr + xs4, mask=xm4, other=0.0), tl.load(xd_ptr + xs4 + 1, mask=xm4, other=0.0)
    xs_lo, xs_hi = tl.load(xs_ptr + xs4, mask=xm4, other=0.0), tl.load(xs_ptr + xs4 + 1, mask=xm4, other=0.0)
    return _f16w(hdr) * (sc_lo * xd_lo * lo.to(tl.float32) + sc_hi * xd_hi * hi.to(tl.float32)) \
        - _f16w(hdr >> 16) * (mn_lo * xs_lo + mn_hi * xs_hi)                                  # [BM, R, SB, 4]


@_triton.jit
def _q6k_step(w_ptr, roff, rmask, xq_ptr, xd_ptr, xoff, soff, mmask, st, nsb, SB: tl.constexpr, ASM: tl.constexpr):
    """Q6_K super-blocks st*SB.. (210 bytes: ql[128], qh[64], i8 scales[16], d) -> float [BM, R, SB, 8].
    Sub-block s (32 values, half s//4, quarter t = s%4), word i: ql nibbles (t//2) of bytes 64 half +
    32 (t%2) + 4i.., qh bits 2t..2t+1 of bytes 128 + 32 half + 4i.., scale 2s + i//4."""
    sb, s, i = st * SB + tl.arange(0, SB), tl.arange(0, 8), tl.arange(0, 8)
    sb5, s5, i5 = sb[None, None, :, None, None], s[None, None, None, :, None], i[None, None, None, None, :]
    wrow, wmask = w_ptr + roff[None, :, None, None, None], rmask[None, :, None, None, None] & (sb5 < nsb)
    base, half, t = sb5 * 210, s5 // 4, s5 % 4
    ql = _word(wrow, base + 64 * half + 32 * (t % 2) + 4 * i5, wmask)                          # [1, R, SB, 8, 8]
    qh = _word(wrow, base + 128 + 32 * half + 4 * i5, wmask)
    q = _signed(((ql >> (4 * (t // 2))) & 0x0F0F0F0F) | (((qh >> (2 * t)) & 0x03030303) << 4), 32)
    scw = _word(wrow, base + 192 + 4 * (s5 // 2) + 0 * i5, wmask)   # [1, R, SB, 8, 8]: ql's layout, no conversion
    sc = (scw << (24 - 8 * (2 * (s5 % 2) + i5 // 4))) >> 24                                     # int8 scale
    xw = tl.load(xq_ptr + _per_row(xoff, roff) + sb5 * 64 + s5 * 8 + i5,
                 mask=mmask[:, None, None, None, None] & (sb5 < nsb), other=0)                   # [BM, R, SB, 8, 8]
    isum = tl.sum(_dp4a(q, xw, ASM) * sc, axis=4)                                               # [BM, R, SB, 8]
    sb4, s4 = sb[None, None, :, None], s[None, None, None, :]
    d = _half(w_ptr + roff[None, :, None, None], sb4 * 210 + 208, rmask[None, :, None, None] & (sb4 < nsb))
    xd = tl.load(xd_ptr + soff[:, None, None, None] + sb4 * 8 + s4, mask=mmask[:, None, None, None] & (sb4 < nsb),
                 other=0.0)
    return d * xd * isum.to(tl.float32)                                                         # [BM, R, SB, 8]


@_triton.jit
def _q32_step(w_ptr, roff, rmask, xq_ptr, xd_ptr, xs_ptr, xoff, soff, mmask, st, nb, NB: tl.constexpr,
              FMT: tl.constexpr, ASM: tl.constexpr):
    """Blocks of 32, st*NB.. -> float [BM, R, NB]: Q8_0 (34 bytes: d, i8 qs[32]), and the nibble forms
    Q4_0 (18: d, qs[16], minus 8), Q4_1 (20: d, m, qs[16]), Q5_0 (22: d, u32 qh, qs[16], minus 16),
    Q5_1 (24: d, m, qh, qs[16]); nibble word u: values 4u.. (low) and 16 + 4u.. (high)."""
    SIZE = 34 if FMT == 8 else 18 if FMT == 2 else 20 if FMT == 3 else 22 if FMT == 6 else 24
    QS = 2 if FMT == 8 or FMT == 2 else 4 if FMT == 3 else 6 if FMT == 6 else 8
    b = st * NB + tl.arange(0, NB)
    b4 = b[None, None, :, None]
    wrow, wmask = w_ptr + roff[None, :, None, None], rmask[None, :, None, None] & (b4 < nb)
    xrow = xq_ptr + xoff[:, None, None, None] + 0 * roff[None, :, None, None] + b4 * 8     # [BM, R, NB, 1]: see _per_row
    xmask = mmask[:, None, None, None] & (b4 < nb)
    if FMT == 8:
        i4 = tl.arange(0, 8)[None, None, None, :]
        qs = _word(wrow, b4 * SIZE + QS + 4 * i4, wmask)                                         # [1, R, NB, 8]
        isum = tl.sum(_dp4a(qs, tl.load(xrow + i4, mask=xmask, other=0), ASM), axis=3)            # [BM, R, NB]
    else:
        u4 = tl.arange(0, 4)[None, None, None, :]
        qs = _word(wrow, b4 * SIZE + QS + 4 * u4, wmask)                                         # [1, R, NB, 4]
        lo, hi = qs & 0x0F0F0F0F, (qs >> 4) & 0x0F0F0F0F
        if FMT == 6 or FMT == 7:   # fifth bits: qh bit j is value j's
            qh = _word(wrow, b4 * SIZE + QS - 4, wmask)                                          # [1, R, NB, 1]
            lo, hi = lo | _spread(qh >> (4 * u4)), hi | _spread(qh >> (4 * u4 + 16))
        if FMT == 2 or FMT == 6:   # symmetric forms: minus 8 / 16 as signed bytes
            lo, hi = _signed(lo, 8 if FMT == 2 else 16), _signed(hi, 8 if FMT == 2 else 16)
        isum = tl.sum(_dp4a(lo, tl.load(xrow + u4, mask=xmask, other=0), ASM)
                      + _dp4a(hi, tl.load(xrow + 4 + u4, mask=xmask, other=0), ASM), axis=3)
    b3, m3 = b[None, None, :], rmask[None, :, None] & (b[None, None, :] < nb)
    xm3 = mmask[:, None, None] & (b3 < nb)
    part = _half(w_ptr + roff[None, :, None], b3 * SIZE, m3) \
        * tl.load(xd_ptr + soff[:, None, None] + b3, mask=xm3, other=0.0) * isum.to(tl.float32)  # [BM, R, NB]
    if FMT == 3 or FMT == 7:       # + m * sum(x) of the block
        part += _half(w_ptr + roff[None, :, None], b3 * SIZE + 2, m3) \
            * tl.load(xs_ptr + soff[:, None, None] + b3, mask=xm3, other=0.0)
    return part


@_triton.jit
def _tree_sum(v):
    """v [BM, R, N] (N a power of two) summed over its last axis as a fixed pairwise tree: element
    2i + 1 added to 2i, then again on the halves. Why not tl.sum: its order follows the layout
    Triton picks for the whole [BM, R, N] tensor (which part of N a thread holds, which lanes
    shuffle), and that layout changes with BM, so on an H200 a float32 row's sums differed between
    M = 1 and M = 8 (tests/test_gpu_qgemv.py). Elementwise adds of logically indexed halves do not."""
    for _ in tl.static_range(12):   # N <= 4096: a step's blocks x 8 at most (wide_plan, WIDE_WORDS <= 4096)
        if v.shape[2] > 1:
            a, b = tl.split(tl.reshape(v, [v.shape[0], v.shape[1], v.shape[2] // 2, 2]))
            v = a + b
    tl.static_assert(v.shape[2] == 1)
    return tl.reshape(v, [v.shape[0], v.shape[1]])


@_triton.jit
def _wide_kernel(xq_ptr, xd_ptr, xs_ptr, w_ptr, y_ptr, M, N, K, stride_w, stride_y, FMT: tl.constexpr,
                 ACC: tl.constexpr, BLOCK_M: tl.constexpr, R: tl.constexpr, STEP: tl.constexpr, WU: tl.constexpr,
                 ASM: tl.constexpr):
    """Program: R weight rows (int32 words, stride_w * WU apart: Q4_K / Q5_K rows are whole 144 / 176-
    byte super-blocks, so WU = 4 and their qs arrays are 16-byte aligned: 128-bit loads) against the
    BLOCK_M (>= M) rows of q8_1 x (xq int32 words [M, K/4], xd and xs float [M, K/32]), the whole of
    K in one program (no split partials), STEP format blocks a step; y[m, rows] stored (+= if ACC)."""
    rows = tl.program_id(0) * R + tl.arange(0, R)
    rmask = rows < N
    roff = rows.to(tl.int64) * stride_w * WU      # WU: the compiler knows rows start 4 * WU bytes aligned
    ms = tl.arange(0, BLOCK_M)
    mmask = ms < M
    xoff, soff = ms.to(tl.int64) * (K // 32) * 8, ms.to(tl.int64) * (K // 32)   # x rows: 32-byte aligned
    nblk = K // 256 if FMT == 12 or FMT == 13 or FMT == 14 else K // 32
    # the steps' partials are summed unreduced (elementwise, in step order) and reduced once at the end
    # in a fixed pairwise order (_tree_sum): no cross-lane shuffles in the loop, and a row's float
    # order is the same at every M
    if FMT == 12 or FMT == 13:
        part4 = tl.zeros([BLOCK_M, R, STEP, 4], dtype=tl.float32)
        for st in range(0, tl.cdiv(nblk, STEP)):
            part4 += _q45k_step(w_ptr, roff, rmask, xq_ptr, xd_ptr, xs_ptr, xoff, soff, mmask, st, nblk, STEP, FMT, ASM)
        acc = _tree_sum(tl.reshape(part4, [BLOCK_M, R, STEP * 4]))
    elif FMT == 14:
        part8 = tl.zeros([BLOCK_M, R, STEP, 8], dtype=tl.float32)
        for st in range(0, tl.cdiv(nblk, STEP)):
            part8 += _q6k_step(w_ptr, roff, rmask, xq_ptr, xd_ptr, xoff, soff, mmask, st, nblk, STEP, ASM)
        acc = _tree_sum(tl.reshape(part8, [BLOCK_M, R, STEP * 8]))
    else:
        part = tl.zeros([BLOCK_M, R, STEP], dtype=tl.float32)
        for st in range(0, tl.cdiv(nblk, STEP)):
            part += _q32_step(w_ptr, roff, rmask, xq_ptr, xd_ptr, xs_ptr, xoff, soff, mmask, st, nblk, STEP, FMT, ASM)
        acc = _tree_sum(part)                                                                   # [BM, R]
    out = y_ptr + ms[:, None].to(tl.int64) * stride_y + rows[None, :]
    omask = mmask[:, None] & rmask[None, :]
    if ACC:
        acc += tl.load(out, mask=omask, other=0.0).to(tl.float32)
    tl.store(out, acc.to(y_ptr.dtype.element_ty), mask=omask)


def wide_plan(n: int, k: int, qtype: int, sms: int, max_rows: int = WIDE_ROWS) -> tuple[int, int]:
    """(R rows a program, STEP format blocks a K step): R halved from max_rows (to 2) until about
    WIDE_PROGRAMS_PER_SM programs per SM; STEP so that a step loads ~WIDE_WORDS weight words, at most
    the row's blocks rounded up to a power of two. Neither depends on M: a step's partial sums are
    added to the accumulator one step at a time, so a STEP that changed with M would change a row's
    float sums with its batch (the interpreted test caught it). The cost: each row of x adds its
    words and products to a thread's registers (ptxas, sm_90, 1024 words: one row 40-56 registers,
    8 rows 122-240, no spills). Why not fewer words: a GEMV's whole matrix is a few DRAM latencies of
    bytes (Llama-8B's wo, 9.4 MB: ~4), so each thread must keep 16-byte loads in flight (Triton
    does not pipeline this loop); `gpu_qmatmul_bench.py --tune` sweeps WIDE_WORDS on a card."""
    r = max_rows   # plain integer math: the module's AOT list calls this at load, before any triton import
    while r > 2 and -(-n // r) < WIDE_PROGRAMS_PER_SM * sms:
        r //= 2
    words, values = {T.Q4_K: (32, 256), T.Q5_K: (32, 256), T.Q6_K: (64, 256), T.Q8_0: (8, 32)}.get(T(qtype), (4, 32))
    step = max(1, WIDE_WORDS // (r * words))
    return r, min(step, 1 << (max(1, k // values) - 1).bit_length())


def wide_warps(m: int) -> int:
    """Warps of a wide GEMV launch of m rows (see WIDE_ROWS_WARPS: 2048 words at 4 warps spill from 2 rows)."""
    return WIDE_WARPS if m == 1 else WIDE_ROWS_WARPS


def reads(x: torch.Tensor, w: QWeight) -> bool:
    """The wide GEMV can serve this product: its formats, 1..WIDE_MAX_M rows, rows of whole 4-byte words
    on a 16-byte aligned base (Q4_K, Q5_K, Q4_1, Q5_1 always; Q6_K, Q8_0, Q5_0, Q4_0 with an even
    number of blocks a row: K = 4096, 14336, 896 ...)."""
    block, size = gguf.GGML_QUANT_SIZES[w.qtype] if w.qtype in WIDE_FORMATS else (1, 1)
    return w.qtype in WIDE_FORMATS and 1 <= x.shape[0] <= WIDE_MAX_M and w.n > 0 \
        and (w.k // block * size) % 4 == 0 and w.raw.stride(0) % (16 if w.qtype in (T.Q4_K, T.Q5_K) else 4) == 0 \
        and w.raw.data_ptr() % 16 == 0


def splits(m: int, n: int, k: int, qtype: int, sms: int) -> int:
    """The whole of K in one program: no partials."""
    return 1


def launch(x: torch.Tensor, w: QWeight, y: torch.Tensor, fused: bool, sms: int, x_q8: tuple | None = None) -> None:
    """x quantized to q8_1 (one launch), then the wide GEMV into y (one launch; + y where `fused`)."""
    m, n = x.shape[0], w.n
    xq, xd, xs = _q8_1.q8_1(x) if x_q8 is None else x_q8   # x_q8: the caller's (qmatmul_gpu FUSES)
    r, step = wide_plan(n, w.k, w.qtype, sms, INTERPRETED_ROWS if interpreted() else WIDE_ROWS)
    words = w.raw.view(torch.int32)                                                            # [N, row_bytes / 4]
    wu = 4 if w.qtype in (T.Q4_K, T.Q5_K) else 1
    _wide_kernel[(_triton.cdiv(n, r),)](xq.view(torch.int32), xd, xs, words, y, m, n, w.k, words.stride(0) // wu,
                                       y.stride(0), FMT=int(w.qtype), ACC=fused, BLOCK_M=_triton.next_power_of_2(m),
                                       R=r, STEP=step, WU=wu, ASM=not interpreted(), num_warps=wide_warps(m))


def _wide_aot(qtype: T, m: int) -> tuple:
    """The wide GEMV as `_wide` launches it for Llama-8B's wo (4096 x 4096) on an H100, m rows of bf16
    x; pointers 16-byte aligned as the JIT sees torch's tensors (so the AOT shows the served loads)."""
    sig = {"xq_ptr": "*i32", "xd_ptr": "*fp32", "xs_ptr": "*fp32", "w_ptr": "*i32", "y_ptr": "*bf16", "M": "i32",
           "N": "i32", "K": "i32", "stride_w": "i32", "stride_y": "i32", "FMT": "constexpr", "ACC": "constexpr",
           "BLOCK_M": "constexpr", "R": "constexpr", "STEP": "constexpr", "WU": "constexpr", "ASM": "constexpr"}
    r, step = wide_plan(4096, 4096, qtype, 132)
    return (_wide_kernel, sig, dict(FMT=int(qtype), ACC=False, BLOCK_M=m, R=r, STEP=step, WU=4 if qtype in (T.Q4_K, T.Q5_K) else 1,
                                    ASM=True), {"num_warps": wide_warps(m), "aligned": ("xq_ptr", "xd_ptr", "xs_ptr", "w_ptr", "y_ptr")})



# The wide GEMV: every format at one row (8 rows compile ~2 s each, too long for the suite: docs/gpu.md
# "Prepared on CPU, 2026-11-27" lists them). ptxas, sm_90, triton 3.9, R = 4, 2048
# words: Q4_K 80 registers, Q5_K 96, Q6_K 80, Q8_0 70, Q5_0 80, Q4_0 76, Q4_1 89, Q5_1 96, no spills; at
# 8 rows and 8 warps 124-249, no spills.
AOT = [_wide_aot(t, 1) for t in WIDE_FORMATS]
