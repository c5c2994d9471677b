"""qmatmul_gpu: `y[M, N] = x[M, K] @ W^T` with W GGUF blocks kept in their raw bytes on the GPU
(`--device cuda --gpu-weights blocks`), the blocks dequantized inside the Triton kernel.

Why a module of its own and not kernels/qmatmul.py's `triton()`: qmatmul.py is the CPU product (C
integer dots, repacked forms, ~450 lines); its `triton()` dequantizes K-quants on the host per
call, which no GPU step can afford. This module reads every format it serves from the device's
copy of the file's blocks, one 32-value slice at a time (`_dequant32`: a legacy 32-block, or one
sub-block of a K super-block), so the weight bytes a step reads are the file's (Q4_K: 0.56 bytes
per weight against bf16's 2; a 0.5B Q4_K_M 330 MB instead of 988, a Llama-3.1-8B 4.9 GB instead
of 16, a 70B Q4_K that fits an 80 GB card at all).

Formats (`FORMATS`; ggml-common.h's layouts, see runtime/qblocks.py): Q4_0, Q4_1, Q5_0, Q5_1,
Q8_0, Q4_K, Q5_K, Q6_K, MXFP4: what Q4_K_M / Q5_K_M / Q6_K / Q8_0 files and gpt-oss use (Q4_K_M
mixes Q4_K and Q6_K, with Q5_0 / Q8_0 fallbacks for rows not a multiple of 256). Q2_K / Q3_K and
the IQ formats have no kernel here: on CUDA they are dequantized to bf16 at load (weights.py).

Regimes (`_qmm_kernel`'s tile sizes are its constexprs):
- decode (M <= SMALL_M): one row (b=1) as a GEMV (BLOCK_M = 1: the dequantized [64, 32] slice
  times x summed in registers; a tl.dot would first shuffle the slice through shared memory into
  the MMA operand layout, for 1 useful row in 16); 2-16 rows with BLOCK_M = 16 (tl.dot's smallest;
  rows past M are masked) and 32-column blocks; both with K split over a third grid axis
  (`SPLIT_K` programs per column block, each a contiguous range of blocks, until about
  PROGRAMS_PER_SM programs per SM) so that a [1, 4864] x [4864, 896] call still spreads over every
  SM; every weight byte is read once per call. Split partials go to a float32 [SPLIT_K, M, N]
  buffer summed by torch (deterministic, unlike atomics: a row's floats never depend on the
  launch order). A row's floats are the same at every M within one regime (the split depends on
  N and K only), not across regimes (the GEMV sums in another order): batch-invariant as far as
  cuBLAS on a dense copy is, which picks its kernel by M too.
- 1 to WIDE_MAX_M (8) rows of WIDE_FORMATS (all of FORMATS but MXFP4, whose 17-byte blocks are
  not word-aligned) with QGEMV = "wide" (the default; env SLOTSERVER_QGEMV=slices for the kernel
  above, which served until an H200 run showed this one 2.8-4x faster a model step): llama.cpp's
  CUDA `mmvq` in Triton (`_wide_kernel`). x is quantized once per call to q8_1 (`_q8_1_kernel`: int8
  per 32 values, float d and d * sum), each program reads R whole weight rows as int32 words (Q4_K,
  Q5_K: the 128-byte qs arrays with 16-byte loads; the 2-byte aligned Q6_K / Q8_0 / Q5_0 / Q4_0
  blocks with a funnel shift of two words), unpacks nibbles with integer masks in registers and multiplies 4
  weights by 4 activations per PTX dp4a, summed in int32 and scaled once per 32 (16 for Q6_K); the
  whole of K in one program (no split partials), the residual add in its store. Its floats differ
  from the slices' by the 8-bit activation (as kernels/qmatmul.py on the CPU), within TOL; a row's
  floats do not depend on M within 1..8 (wide_plan's STEP ignores M and the partials are summed in
  a fixed tree, `_tree_sum`; tests/test_gpu_qgemv.py on a card). On an H200, Q4_K at one row beats
  cuBLAS on the dense bf16 copy on every Llama-8B matmul (docs/gpu.md); at 8 rows it does not (the
  int math of 8 rows per weight word: 198 registers a thread).
- 2 to SMALL_M rows of Q4_K and Q6_K with QMMA = "int8" (env SLOTSERVER_QMMA=int8; off until a card
  shows it faster than the wide GEMV): x's q8_1 rows padded to 16 times each 32-value sub-block's
  unpacked values in int8 tl.dots (mma m16n8k32 on sm_80+), the float scales applied per sub-block
  after them; K split over programs (float32 partials summed by torch) until ~MMA_PROGRAMS_PER_SM programs
  an SM; `_mma_kernel`. Its floats are the wide GEMV's product in another summation order.
- 17 to DEQUANT_GEMM_ROWS - 1 rows (the GEMM; none while DEQUANT_GEMM_ROWS is 17): 64 x 64 tiles, K inside, each program dequantizing a [64, 32] weight slice
  into registers per step for one tl.dot; the slice is re-read by every M tile (from L2: a
  Llama-8B layer matmul is 10-60 MB of blocks, and at large M the product is compute-bound).
- from DEQUANT_GEMM_ROWS rows (prefill): W dequantized to x's dtype a tile at a time by
  `_dequant_kernel` (the same `_dequant32`), multiplied by cuBLAS (`_dequant_gemm`).
The slices kernel's tile constants were chosen by ptxas's register counts (below); the wide GEMV's
(WIDE_*) by an H200's clock (`playground/gpu_qmatmul_bench.py --tune S` sweeps both on a card).
Where cuBLAS on a dense bf16 copy beats this is measured by playground/gpu_qmatmul_bench.py and
decided by `--gpu-weights` (model/config.py; docs/architecture.md "Weights on the GPU").

Fusions: `acc` (the residual add) is fused into the store where K is not split; the model's
norm / SiLU-gate prologue runs as the rms_norm / silu_mul kernels before (QLinear.fused).

TOL: the weight is dequantized exactly in float32 and rounded to x's dtype for tl.dot (bf16: 2^-9
relative, as a dense bf16 copy is), the sums are float32; float32 x multiplies in IEEE float32.
"""

from __future__ import annotations

import os

import gguf
import torch
import triton as _triton
import triton.language as tl

from slotserver.runtime.gpu_info import interpreted, sm_count
from slotserver.runtime.qblocks import FLOATS, T, QWeight, dequantize, random_qweight

OP = "qmatmul_gpu"
TOL = {torch.float32: 3e-2, torch.bfloat16: 4e-2}
FORMATS = (T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.Q4_K, T.Q5_K, T.Q6_K, T.MXFP4)
SMALL_M = 16                       # rows up to which the decode regime serves
DECODE_BLOCK_N, GEMM_BLOCK_M, GEMM_BLOCK_N = 32, 64, 64
GEMV_BLOCK_N = 64                  # one row (decode b=1): no tl.dot, wider column blocks
PROGRAMS_PER_SM = 4                # the decode regime splits K until about this many programs per SM
# rows from which W is dequantized tile by tile for cuBLAS (_dequant_gemm). Was 128; on an H100
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


def reference(x: torch.Tensor, w: QWeight, acc: torch.Tensor | None = None) -> torch.Tensor:
    """gguf's dequantizer, then a float32 matmul: x [M, K] -> [M, N] in x's dtype (added into acc
    and acc returned when given)."""
    wf = dequantize(w) if w.qtype not in FLOATS else w.float_view().cpu().float()
    y = (x.cpu().float() @ wf.T).to(x.dtype).to(x.device)
    return y if acc is None else acc.add_(y.to(acc.dtype))


def cpu(x: torch.Tensor, w: QWeight, acc: torch.Tensor | None = None) -> torch.Tensor:
    """On the CPU the blocks are served by kernels/qmatmul.py; this is the same product by gguf's
    dequantizer and torch (what qmatmul does without a compiler), so the contract holds."""
    return reference(x, w, acc)


@_triton.jit
def _f16(ptr, mask):
    """A little-endian float16 at byte pointers `ptr` -> float32 (blocks are not 2-byte aligned)."""
    lo = tl.load(ptr, mask=mask, other=0).to(tl.uint16)
    hi = tl.load(ptr + 1, mask=mask, other=0).to(tl.uint16)
    return (lo | (hi << 8)).to(tl.float16, bitcast=True).to(tl.float32)


@_triton.jit
def _u8(ptr, mask):
    return tl.load(ptr, mask=mask, other=0).to(tl.int32)


@_triton.jit
def _scale_min_k4(sp, s, mask):
    """ggml's get_scale_min_k4: sub-block s's 6-bit scale and min from a Q4_K/Q5_K scales[12]."""
    a = _u8(sp + s, mask)
    b = _u8(sp + s + 4, mask)
    c = _u8(sp + (s + 4) % 8, mask)          # scales[s - 4] where s >= 4 (unused below)
    low = s < 4
    sc = tl.where(low, a & 63, (b & 15) | ((c >> 6) << 4))
    mn = tl.where(low, b & 63, (b >> 4) | ((a >> 6) << 4))
    return sc.to(tl.float32), mn.to(tl.float32)


@_triton.jit
def _dequant32(rows, kb, j, nmask, FMT: tl.constexpr):
    """Values kb*32 + j (j = arange(32) as [1, 32]) of the weight rows starting at byte pointers
    `rows` [BN, 1] -> float32 [BN, 32]. FMT: the GGMLQuantizationType value."""
    if FMT == 8:      # Q8_0: h d, i8 qs[32]
        blk = rows + kb * 34
        w = tl.load(blk + 2 + j, mask=nmask, other=0).to(tl.int8, bitcast=True).to(tl.float32) * _f16(blk, nmask)
    elif FMT == 2:    # Q4_0: h d, qs[16] (low nibbles values 0..15, high 16..31), minus 8
        blk = rows + kb * 18
        q = (_u8(blk + 2 + j % 16, nmask) >> (4 * (j // 16))) & 15
        w = (q - 8).to(tl.float32) * _f16(blk, nmask)
    elif FMT == 3:    # Q4_1: h d, h m, qs[16]
        blk = rows + kb * 20
        q = (_u8(blk + 4 + j % 16, nmask) >> (4 * (j // 16))) & 15
        w = q.to(tl.float32) * _f16(blk, nmask) + _f16(blk + 2, nmask)
    elif FMT == 6:    # Q5_0: h d, u32 qh (bit j: value j's fifth bit), qs[16], minus 16
        blk = rows + kb * 22
        h = (_u8(blk + 2 + j // 8, nmask) >> (j % 8)) & 1
        q = ((_u8(blk + 6 + j % 16, nmask) >> (4 * (j // 16))) & 15) | (h << 4)
        w = (q - 16).to(tl.float32) * _f16(blk, nmask)
    elif FMT == 7:    # Q5_1: h d, h m, u32 qh, qs[16]
        blk = rows + kb * 24
        h = (_u8(blk + 4 + j // 8, nmask) >> (j % 8)) & 1
        q = ((_u8(blk + 8 + j % 16, nmask) >> (4 * (j // 16))) & 15) | (h << 4)
        w = q.to(tl.float32) * _f16(blk, nmask) + _f16(blk + 2, nmask)
    elif FMT == 39:   # MXFP4: u8 e, qs[16]: kvalues {0,1,2,3,4,6,8,12, negatives} * 2^(e-128)
        blk = rows + kb * 17
        nib = (_u8(blk + 1 + j % 16, nmask) >> (4 * (j // 16))) & 15
        mag = nib & 7
        v = tl.where(mag < 5, mag, tl.where(mag == 5, 6, tl.where(mag == 6, 8, 12)))
        v = tl.where(nib >= 8, -v, v)
        e = _u8(blk, nmask)
        bits = tl.where(e < 2, 0x200000 << e, (e - 1) << 23)   # ggml's GGML_E8M0_TO_FP32_HALF
        w = v.to(tl.float32) * bits.to(tl.float32, bitcast=True)
    elif FMT == 12:   # Q4_K: h d, h dmin, scales[12], qs[128]; sub-block s: nibbles of qs[32 (s//2) ..]
        s = kb % 8
        blk = rows + (kb // 8) * 144
        sc, mn = _scale_min_k4(blk + 4, s, nmask)
        q = (_u8(blk + 16 + 32 * (s // 2) + j, nmask) >> (4 * (s % 2))) & 15
        w = _f16(blk, nmask) * sc * q.to(tl.float32) - _f16(blk + 2, nmask) * mn
    elif FMT == 13:   # Q5_K: h d, h dmin, scales[12], qh[32] (bit s), qs[128]
        s = kb % 8
        blk = rows + (kb // 8) * 176
        sc, mn = _scale_min_k4(blk + 4, s, nmask)
        h = (_u8(blk + 16 + j, nmask) >> s) & 1
        q = ((_u8(blk + 48 + 32 * (s // 2) + j, nmask) >> (4 * (s % 2))) & 15) | (h << 4)
        w = _f16(blk, nmask) * sc * q.to(tl.float32) - _f16(blk + 2, nmask) * mn
    else:             # Q6_K (14): ql[128], qh[64], i8 scales[16], h d; slice s: half s//4, quarter s%4
        s = kb % 8
        half, t = s // 4, s % 4
        blk = rows + (kb // 8) * 210
        lo = (_u8(blk + 64 * half + 32 * (t % 2) + j, nmask) >> (4 * (t // 2))) & 15
        hi = (_u8(blk + 128 + 32 * half + j, nmask) >> (2 * t)) & 3
        sc = tl.load(blk + 192 + 8 * half + 2 * t + j // 16, mask=nmask, other=0).to(tl.int8, bitcast=True)
        w = _f16(blk + 208, nmask) * sc.to(tl.float32) * ((lo | (hi << 4)) - 32).to(tl.float32)
    return w


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


def _dequant_gemm(x: torch.Tensor, w: QWeight, acc: torch.Tensor | None) -> torch.Tensor:
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


# ---- the wide GEMV (QGEMV = "wide"): llama.cpp's mmvq in Triton, for 1..WIDE_MAX_M rows ----------------
# Why the q8_1 route and not float math after unpacking (docs/gpu.md, "Prepared on CPU, 2026-11-27"):
# a GEMV at the H100's ~3 TB/s must retire ~20 Q4_K weights per clock per SM. Unpacked to floats, a
# weight costs ~2 integer ops (shift, mask; 64/clk/SM) plus a conversion and one FMA per row: ~21
# weights/clk at M=1 and ~10 at M=8, compute-bound below the bandwidth. With x quantized to int8 per
# 32 (q8_1, once per call), 4 weights cost ~1.5 integer ops plus one dp4a per row (64/clk/SM): ~27
# weights/clk even at M=8, which is why llama.cpp's CUDA backend serves 1..8 rows with mmvq.
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
WIDE_PROGRAMS_PER_SM = 4   # rows per program (2..16) are halved until about this many programs per SM
QUANT_BLOCKS = 32      # 32-value blocks of x a quantizing program handles


def _qgemv_mode() -> str:
    """SLOTSERVER_QGEMV: `wide` (the default since an H200 run, docs/gpu.md 2026-11-27: Llama-8B's
    shape in Q4_K at b=1 4.1 ms a step against the slices' 11.4, at b=8 17.2 against 68.6) or `slices`
    (the per-32-value kernel above, kept for formats and rows the wide one cannot read and as the A/B);
    read once at load, so a bench flips the module constant `QGEMV`."""
    return _env_switch("SLOTSERVER_QGEMV", "wide", ("slices", "wide"))


def _env_switch(name: str, default: str, choices: tuple[str, ...]) -> str:
    """Environment variable `name` (default `default`), refused by name unless one of `choices`."""
    mode = os.environ.get(name, default)
    if mode not in choices:
        raise ValueError(f"{name}={mode!r}: expected {' or '.join(map(repr, choices))}")
    return mode


QGEMV = _qgemv_mode()


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
def _word(wrow, byte, mask):
    """The int32 at an even byte offset of rows `wrow` (int32 pointers): one load where the offset is
    4-aligned, two (the second from L1) and a funnel shift where it is not (Q6_K, Q8_0, Q5_0 blocks
    are 2-byte aligned). The second word never passes the row's end (`_wide_ok`: rows of 4k bytes)."""
    w0 = byte // 4
    odd = (byte % 4) != 0
    lo = tl.load(wrow + w0, mask=mask, other=0)
    hi = tl.load(wrow + w0 + 1, mask=mask & odd, other=0)
    return tl.where(odd, ((lo >> 16) & 0xFFFF) | (hi << 16), lo)


@_triton.jit
def _f16w(v):
    """The float16 in the low 16 bits of int32 v -> float32."""
    return (v & 0xFFFF).to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)


@_triton.jit
def _half(wrow, byte, mask):
    """The float16 at an even byte offset of rows `wrow` -> float32."""
    return _f16w(tl.load(wrow + byte // 4, mask=mask, other=0) >> (8 * (byte % 4)))


@_triton.jit
def _spread(v):
    """Bits 0..3 of v to bit 4 of bytes 0..3 (Q5_0's fifth bits beside their nibbles)."""
    return ((v << 4) & 0x10) | ((v << 11) & 0x1000) | ((v << 18) & 0x100000) | ((v << 25) & 0x10000000)


@_triton.jit
def _signed(v, BIAS: tl.constexpr):
    """Every byte of v (each < 128) minus BIAS, as signed bytes, with no borrow between bytes."""
    return ((v | -0x7F7F7F80) - BIAS * 0x01010101) ^ -0x7F7F7F80   # -0x7F7F7F80: 0x80808080, bit 7 of each byte


@_triton.jit
def _k4_scale(s0, s1, s2, s):
    """ggml's get_scale_min_k4 on the scales words s0|s1|s2 ([.., 1]) for sub-blocks s -> float (sc, m)."""
    sh = 8 * (s % 4)
    a, b, c = (s0 >> sh) & 255, (s1 >> sh) & 255, (s2 >> sh) & 255
    sc = tl.where(s < 4, a & 63, (c & 15) | ((a >> 6) << 4))
    mn = tl.where(s < 4, b & 63, (c >> 4) | ((b >> 6) << 4))
    return sc.to(tl.float32), mn.to(tl.float32)


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


def q8_1(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x [M, K] (K a multiple of 32) -> (int8 q [M, K], float d [M, K/32], float s [M, K/32]), one launch."""
    m, k = x.shape
    q = torch.empty(m, k, dtype=torch.int8, device=x.device)
    d, s = (torch.empty(m, k // 32, dtype=torch.float32, device=x.device) for _ in range(2))
    if m and k:
        _q8_1_kernel[(m, _triton.cdiv(k // 32, QUANT_BLOCKS))](x, q, d, s, k, x.stride(0), QB=QUANT_BLOCKS)
    return q, d, s


def wide_plan(n: int, k: int, qtype: int, sms: int) -> tuple[int, int]:
    """(R rows a program, STEP format blocks a K step): R halved from 16 (to 2) until about
    WIDE_PROGRAMS_PER_SM programs per SM; STEP so that a step loads ~WIDE_WORDS weight words, at most
    the row's blocks rounded up to a power of two. Neither depends on M: a step's partial sums are
    added to the accumulator one step at a time, so a STEP that changed with M would change a row's
    float sums with its batch (the interpreted test caught it). The cost: each row of x adds its
    words and products to a thread's registers (ptxas, sm_90, 1024 words: one row 40-56 registers,
    8 rows 122-240, no spills). Why not fewer words: a GEMV's whole matrix is a few DRAM latencies of
    bytes (Llama-8B's wo, 9.4 MB: ~4), so each thread must keep 16-byte loads in flight (Triton
    does not pipeline this loop); `gpu_qmatmul_bench.py --tune` sweeps WIDE_WORDS on a card."""
    r = 16   # plain integer math: the module's AOT list calls this at load, before any triton import
    while r > 2 and -(-n // r) < WIDE_PROGRAMS_PER_SM * sms:
        r //= 2
    words, values = {T.Q4_K: (32, 256), T.Q5_K: (32, 256), T.Q6_K: (64, 256), T.Q8_0: (8, 32)}.get(T(qtype), (4, 32))
    step = max(1, WIDE_WORDS // (r * words))
    return r, min(step, 1 << (max(1, k // values) - 1).bit_length())


def _wide_warps(m: int) -> int:
    """Warps of a wide GEMV launch of m rows (see WIDE_ROWS_WARPS: 2048 words at 4 warps spill from 2 rows)."""
    return WIDE_WARPS if m == 1 else WIDE_ROWS_WARPS


def _wide_ok(x: torch.Tensor, w: QWeight) -> bool:
    """The wide GEMV serves: switched on, its formats, 1..WIDE_MAX_M rows, rows of whole 4-byte words
    on a 16-byte aligned base (Q4_K, Q5_K, Q4_1, Q5_1 always; Q6_K, Q8_0, Q5_0, Q4_0 with an even
    number of blocks a row: K = 4096, 14336, 896 ...)."""
    block, size = gguf.GGML_QUANT_SIZES[w.qtype] if w.qtype in WIDE_FORMATS else (1, 1)
    return QGEMV == "wide" and w.qtype in WIDE_FORMATS and 1 <= x.shape[0] <= WIDE_MAX_M and w.n > 0 \
        and (w.k // block * size) % 4 == 0 and w.raw.stride(0) % (16 if w.qtype in (T.Q4_K, T.Q5_K) else 4) == 0 \
        and w.raw.data_ptr() % 16 == 0


def _wide(x: torch.Tensor, w: QWeight, acc: torch.Tensor | None) -> torch.Tensor:
    """x quantized to q8_1 (one launch), then the wide GEMV (one launch); acc added in its store."""
    m, n = x.shape[0], w.n
    xq, xd, xs = q8_1(x)
    r, step = wide_plan(n, w.k, w.qtype, sm_count(x.device))
    y, fused = _output(x, n, 1, acc)
    words = w.raw.view(torch.int32)                                                            # [N, row_bytes / 4]
    wu = 4 if w.qtype in (T.Q4_K, T.Q5_K) else 1
    _wide_kernel[(_triton.cdiv(n, r),)](xq.view(torch.int32), xd, xs, words, y, m, n, w.k, words.stride(0) // wu,
                                       y.stride(0), FMT=int(w.qtype), ACC=fused, BLOCK_M=_triton.next_power_of_2(m),
                                       R=r, STEP=step, WU=wu, ASM=not interpreted(), num_warps=_wide_warps(m))
    return _finish(y, x, 1, fused, acc)


# ---- int8 tensor cores (QMMA = "int8"): 2..SMALL_M rows of Q4_K, Q6_K ------------------------------
# The wide GEMV multiplies each weight word once per row of x with dp4a: at 8 rows ~14 instructions a
# weight, 3.3-5.2x slower than cuBLAS on a dense copy (H200, docs/gpu.md). Here x's q8_1 rows (the
# wide GEMV's x, padded to 16) meet each 32-value sub-block's unpacked values in int8 tl.dots
# ([16, 32] x [32, BLOCK_N] -> int32: mma m16n8k32), so a weight's unpack (a mask or a shift a byte)
# is paid once for all rows, and the float scales (d * sc, dmin * m, x's d and d * sum) are applied
# per sub-block and column after the dot. Off by default (env SLOTSERVER_QMMA=int8) until a card shows it
# faster than the wide GEMV at 2..8 rows; Q4_K and Q6_K (a Q4_K_M file's two formats).
# weight rows (output columns) a program; ptxas, sm_90, 4 warps: Q4_K at 64 142 registers, Q6_K at 32
# 141 (at 64 its byte loads from 2-byte aligned blocks took 255), no spills
MMA_FORMATS = (T.Q4_K, T.Q6_K)   # what a Q4_K_M file holds (but its fallbacks for rows not of 256)
MMA_BLOCK_N = {T.Q4_K: 64, T.Q6_K: 32}
MMA_WARPS = 4
MMA_PROGRAMS_PER_SM = 2    # K is split (float32 partials summed by torch) until about this many programs an SM


def _qmma_mode() -> str:
    """SLOTSERVER_QMMA: `off` (default) or `int8`; read once at load (a bench flips the constant QMMA)."""
    return _env_switch("SLOTSERVER_QMMA", "off", ("off", "int8"))


QMMA = _qmma_mode()


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
    (within 2..SMALL_M rows: x is always 16 rows, the dot's shape fixed)."""
    tiles, nsb = -(-n // block_n), k // 256
    want = -(-(MMA_PROGRAMS_PER_SM * sms) // tiles)          # splits that would fill the card
    sb_split = max(1, min(nsb, max(2, nsb // want)))
    return tiles, sb_split, -(-nsb // sb_split)



def _mma_ok(x: torch.Tensor, w: QWeight) -> bool:
    """The int8 tensor-core product serves: switched on, Q4_K (16-byte aligned rows) or Q6_K, 2..SMALL_M rows."""
    return QMMA == "int8" and w.qtype in MMA_FORMATS and 2 <= x.shape[0] <= SMALL_M and w.n > 0 \
        and (w.qtype == T.Q6_K or (w.raw.stride(0) % 16 == 0 and w.raw.data_ptr() % 16 == 0))


def _mma(x: torch.Tensor, w: QWeight, acc: torch.Tensor | None) -> torch.Tensor:
    """x quantized to q8_1 (one launch), the int8 dots (one launch), split partials summed by torch."""
    m, n = x.shape[0], w.n
    xq, xd, xs = q8_1(x)
    tiles, sb_split, split = mma_plan(n, w.k, sm_count(x.device), MMA_BLOCK_N[w.qtype])
    y, fused = _output(x, n, split, acc)
    q4k = w.qtype == T.Q4_K
    wu = 16 if q4k else 1
    _mma_kernel[(tiles, split)](xq, xd, xs, w.raw, w.raw.view(torch.int32) if q4k else w.raw, y, m, n, w.k,
                                w.raw.stride(0) // wu, y.stride(-2), y.stride(0) if split > 1 else 0, sb_split,
                                FMT=int(w.qtype), WU=wu, ACC=fused, BLOCK_N=MMA_BLOCK_N[w.qtype], SPLIT=split > 1,
                                num_warps=MMA_WARPS)
    return _finish(y, x, split, fused, acc)


def plan(m: int, n: int, k: int, sms: int) -> tuple[int, int, int, int]:
    """(BLOCK_M, BLOCK_N, SPLIT_K, num_warps) for an [m, k] x [k, n] product on a card of `sms` SMs: the
    decode regime splits K until ~4 programs per SM (each reading >= MIN_SPLIT_BLOCKS slices)."""
    if m > SMALL_M:
        return GEMM_BLOCK_M, GEMM_BLOCK_N, 1, GEMM_WARPS
    bm, bn, warps = (1, GEMV_BLOCK_N, GEMV_WARPS) if m == 1 else (16, DECODE_BLOCK_N, DECODE_WARPS)
    tiles = _triton.cdiv(n, bn)
    split = max(1, min(_triton.cdiv(PROGRAMS_PER_SM * sms, tiles), (k // 32) // MIN_SPLIT_BLOCKS))
    return bm, bn, split, warps


def triton(x: torch.Tensor, w: QWeight, acc: torch.Tensor | None = None) -> torch.Tensor:
    """Same contract as `reference` (x and w.raw on the CUDA device, or CPU under TRITON_INTERPRET=1)."""
    assert w.qtype in FORMATS, f"qmatmul_gpu: no kernel for {w.name} (dequantized at load instead)"
    assert x.dim() == 2 and x.shape[1] == w.k and w.raw.stride(1) == 1
    x = x if x.stride(1) == 1 else x.contiguous()
    m, n = x.shape[0], w.n
    if _mma_ok(x, w):
        return _mma(x, w, acc)
    if _wide_ok(x, w):
        return _wide(x, w, acc)
    if m >= DEQUANT_GEMM_ROWS and n:
        return _dequant_gemm(x, w, acc)
    bm, bn, split, warps = plan(m, n, w.k, sm_count(x.device))
    y, fused = _output(x, n, split, acc)
    if m and n:
        grid = (_triton.cdiv(m, bm), _triton.cdiv(n, bn), split)
        _qmm_kernel[grid](x, w.raw, y, m, n, w.k, x.stride(0), w.raw.stride(0), y.stride(-2),
                          y.stride(0) if split > 1 else 0, FMT=int(w.qtype), ACC=fused,
                          BLOCK_M=bm, BLOCK_N=bn, SPLIT_K=split,
                          IEEE_DOT=x.dtype == torch.float32 or interpreted(), num_warps=warps)
    return _finish(y, x, split, fused, acc)


def _output(x: torch.Tensor, n: int, split: int, acc: torch.Tensor | None) -> tuple[torch.Tensor, bool]:
    """Where a K-split product writes: float32 partials [split, M, N] (summed by torch: deterministic,
    unlike atomics), else acc itself when the residual add can be fused into the store (`fused`),
    else a new [M, N] in x's dtype."""
    m = x.shape[0]
    fused = acc is not None and split == 1 and acc.shape == (m, n) and acc.stride(1) == 1
    if split > 1:
        return torch.empty(split, m, n, dtype=torch.float32, device=x.device), False
    return (acc if fused else torch.empty(m, n, dtype=x.dtype, device=x.device)), fused


def _finish(y: torch.Tensor, x: torch.Tensor, split: int, fused: bool, acc: torch.Tensor | None) -> torch.Tensor:
    """`_output`'s buffer as the call's result: the partials summed, in x's dtype or added into acc."""
    if fused:
        return acc
    y = y.sum(0) if split > 1 else y                                                   # [M, N]
    return y.to(x.dtype) if acc is None else acc.add_(y.to(acc.dtype))


def example_inputs(gen: torch.Generator, dtype: torch.dtype) -> tuple:
    """x [M, K] unit-variance with M on both sides of SMALL_M and some past DEQUANT_GEMM_ROWS (every
    regime); W random valid blocks
    of one of FORMATS; a third of the draws add into a float32 residual `acc`."""
    qtype = FORMATS[int(torch.randint(len(FORMATS), (), generator=gen))]
    block = gguf.GGML_QUANT_SIZES[qtype][0]
    k = block * int(torch.randint(1, 3 if block == 256 else 12, (), generator=gen))
    m = int(torch.randint(1, 9, (), generator=gen)) + [0, SMALL_M, DEQUANT_GEMM_ROWS][int(torch.randint(3, (), generator=gen))]
    n = int(torch.randint(1, 80, (), generator=gen))
    w = random_qweight(gen, qtype, n, k)
    x = torch.randn(m, k, generator=gen).to(dtype)
    return (x, w) if torch.rand((), generator=gen) < 0.67 else (x, w, torch.randn(m, n, generator=gen))


def bench_inputs(device: str, small: bool = False) -> list[tuple[str, tuple]]:
    """`lab check --time`: Llama-8B's wo (4096 x 4096) and gate_up (28672 x 4096) in Q4_K, bf16 x
    at decode sizes and a prefill chunk (the bytes counted are the blocks': what a call must read)."""
    gen = torch.Generator().manual_seed(0)
    sizes = [(1, 40, 256)] if small else [(1, 4096, 4096), (8, 4096, 4096), (1, 28672, 4096), (512, 4096, 4096)]
    out = []
    for m, n, k in sizes:
        w = random_qweight(gen, T.Q4_K, n, k)
        out.append((f"Q4_K {m} x {n} x {k}", (torch.randn(m, k, generator=gen).to(device, torch.bfloat16),
                                               QWeight(w.raw.to(device), w.qtype, k, n))))
    return out


def bench_flops(x: torch.Tensor, w: QWeight, acc: torch.Tensor | None = None) -> int:
    return 2 * x.shape[0] * w.n * w.k


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


def _wide_aot(qtype: T, m: int) -> tuple:
    """The wide GEMV as `_wide` launches it for Llama-8B's wo (4096 x 4096) on an H100, m rows of bf16
    x; pointers 16-byte aligned as the JIT sees torch's tensors (so the AOT shows the served loads)."""
    sig = {"xq_ptr": "*i32", "xd_ptr": "*fp32", "xs_ptr": "*fp32", "w_ptr": "*i32", "y_ptr": "*bf16", "M": "i32",
           "N": "i32", "K": "i32", "stride_w": "i32", "stride_y": "i32", "FMT": "constexpr", "ACC": "constexpr",
           "BLOCK_M": "constexpr", "R": "constexpr", "STEP": "constexpr", "WU": "constexpr", "ASM": "constexpr"}
    r, step = wide_plan(4096, 4096, qtype, 132)
    return (_wide_kernel, sig, dict(FMT=int(qtype), ACC=False, BLOCK_M=m, R=r, STEP=step, WU=4 if qtype in (T.Q4_K, T.Q5_K) else 1,
                                    ASM=True), {"num_warps": _wide_warps(m), "aligned": ("xq_ptr", "xd_ptr", "xs_ptr", "w_ptr", "y_ptr")})


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


# The wide GEMV: every format at one row (8 rows compile ~2 s each, too long for the suite: docs/gpu.md
# "Prepared on CPU, 2026-11-27" lists them), and the x quantizer. ptxas, sm_90, triton 3.9, R = 4, 2048
# words: Q4_K 80 registers, Q5_K 96, Q6_K 80, Q8_0 70, Q5_0 80, Q4_0 76, Q4_1 89, Q5_1 96, no spills; at
# 8 rows and 8 warps 124-249, no spills; q8_1 38.
AOT += [_wide_aot(t, 1) for t in WIDE_FORMATS] + [_mma_aot(t) for t in MMA_FORMATS] + \
    [(_q8_1_kernel, {"x_ptr": "*bf16", "q_ptr": "*i8", "d_ptr": "*fp32", "s_ptr": "*fp32", "K": "i32", "stride_x": "i32",
                     "QB": "constexpr"}, {"QB": QUANT_BLOCKS}, {"aligned": ("x_ptr", "q_ptr", "d_ptr", "s_ptr")})]
