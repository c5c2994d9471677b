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
- 17 to DEQUANT_GEMM_ROWS - 1 rows (the GEMM): 64 x 64 tiles, K inside, each program dequantizing a [64, 32] weight slice
  into registers per step for one tl.dot; the slice is re-read by every M tile (from L2: a
  Llama-8B layer matmul is 10-60 MB of blocks, and at large M the product is compute-bound).
- from DEQUANT_GEMM_ROWS rows (prefill): W dequantized to x's dtype a tile at a time by
  `_dequant_kernel` (the same `_dequant32`), multiplied by cuBLAS (`_dequant_gemm`).
The tile constants were chosen by ptxas's register counts (below), not yet by a GPU's clock:
`playground/gpu_qmatmul_bench.py --tune S` sweeps the decode ones on a card.
Where cuBLAS on a dense bf16 copy beats this is measured by playground/gpu_qmatmul_bench.py and
decided by `--gpu-weights` (model/config.py; docs/architecture.md "Weights on the GPU").

Fusions: `acc` (the residual add) is fused into the store where K is not split; the model's
norm / SiLU-gate prologue runs as the rms_norm / silu_mul kernels before (QLinear.fused).

TOL: the weight is dequantized exactly in float32 and rounded to x's dtype for tl.dot (bf16: 2^-9
relative, as a dense bf16 copy is), the sums are float32; float32 x multiplies in IEEE float32.
"""

from __future__ import annotations

import functools
import os

import gguf
import torch
import triton as _triton
import triton.language as tl

from slotserver.runtime.qblocks import FLOATS, T, QWeight, dequantize, random_qweight

OP = "qmatmul_gpu"
TOL = {torch.float32: 3e-2, torch.bfloat16: 4e-2}
FORMATS = (T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.Q4_K, T.Q5_K, T.Q6_K, T.MXFP4)
SMALL_M = 16                       # rows up to which the decode regime serves
DECODE_BLOCK_N, GEMM_BLOCK_M, GEMM_BLOCK_N = 32, 64, 64
GEMV_BLOCK_N = 64                  # one row (decode b=1): no tl.dot, wider column blocks
PROGRAMS_PER_SM = 4                # the decode regime splits K until about this many programs per SM
DEQUANT_GEMM_ROWS = 128            # rows from which W is dequantized tile by tile for cuBLAS (_dequant_gemm)
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


def plan(m: int, n: int, k: int, sms: int) -> tuple[int, int, int, int]:
    """(BLOCK_M, BLOCK_N, SPLIT_K, num_warps) for an [m, k] x [k, n] product on a card of `sms` SMs: the
    decode regime splits K until ~4 programs per SM (each reading >= MIN_SPLIT_BLOCKS slices)."""
    if m > SMALL_M:
        return GEMM_BLOCK_M, GEMM_BLOCK_N, 1, GEMM_WARPS
    bm, bn, warps = (1, GEMV_BLOCK_N, GEMV_WARPS) if m == 1 else (16, DECODE_BLOCK_N, DECODE_WARPS)
    tiles = _triton.cdiv(n, bn)
    split = max(1, min(_triton.cdiv(PROGRAMS_PER_SM * sms, tiles), (k // 32) // MIN_SPLIT_BLOCKS))
    return bm, bn, split, warps


def _interpreted() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


@functools.cache
def _sms_of(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def _sms(device: torch.device) -> int:
    """SMs of x's card (cached: a decode step makes ~100 calls); 1 off a GPU (the interpreter)."""
    return _sms_of(device.index if device.index is not None else torch.cuda.current_device()) \
        if device.type == "cuda" else 1


def triton(x: torch.Tensor, w: QWeight, acc: torch.Tensor | None = None) -> torch.Tensor:
    """Same contract as `reference` (x and w.raw on the CUDA device, or CPU under TRITON_INTERPRET=1)."""
    assert w.qtype in FORMATS, f"qmatmul_gpu: no kernel for {w.name} (dequantized at load instead)"
    assert x.dim() == 2 and x.shape[1] == w.k and w.raw.stride(1) == 1
    x = x if x.stride(1) == 1 else x.contiguous()
    m, n = x.shape[0], w.n
    if m >= DEQUANT_GEMM_ROWS and n:
        return _dequant_gemm(x, w, acc)
    bm, bn, split, warps = plan(m, n, w.k, _sms(x.device))
    fused = acc is not None and split == 1 and acc.shape == (m, n) and acc.stride(1) == 1
    if split > 1:
        y = torch.empty(split, m, n, dtype=torch.float32, device=x.device)
    else:
        y = acc if fused else torch.empty(m, n, dtype=x.dtype, device=x.device)
    if m and n:
        grid = (_triton.cdiv(m, bm), _triton.cdiv(n, bn), split)
        _qmm_kernel[grid](x, w.raw, y, m, n, w.k, x.stride(0), w.raw.stride(0), y.stride(-2),
                          y.stride(0) if split > 1 else 0, FMT=int(w.qtype), ACC=fused,
                          BLOCK_M=bm, BLOCK_N=bn, SPLIT_K=split,
                          IEEE_DOT=x.dtype == torch.float32 or _interpreted(), num_warps=warps)
    if fused:
        return acc
    if split > 1:
        y = y.sum(0)                                              # [M, N] float32
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
