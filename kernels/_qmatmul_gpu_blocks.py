"""qmatmul_gpu's readers of GGUF blocks in Triton: the bytes and int32 words of a file's blocks on the
card -> values and scales (ggml-common.h's layouts; runtime/qblocks.py has them in torch).

Two kinds, for the two ways qmatmul_gpu's products read:
- byte readers (`_f16`, `_u8`, `_scale_min_k4`, `_dequant32`): any format at any alignment, 32
  values at a time as float32: the slices kernel and the prefill dequantizer (_qmatmul_gpu_slices.py);
- word readers (`_word`, `_f16w`, `_half`, `_spread`, `_signed`, `_k4_scale`): int32 words that keep
  4 values packed for integer dot products: the wide GEMV (_qmatmul_gpu_wide.py) and the int8
  tensor-core product (_qmatmul_gpu_mma.py).
A part of kernels/qmatmul_gpu.py (runtime/kernel_parts.py): validated, versioned and reloaded with it.
"""

from __future__ import annotations

import triton as _triton
import triton.language as tl


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

