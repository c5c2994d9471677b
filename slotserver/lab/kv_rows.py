"""Writing a step's new K/V rows into a strided layout: one C call for K and V together.

`write_rows(k_dst, v_dst, streams, positions, k, v)` stores `k[t]` / `v[t]` (`[tokens, kv_heads,
head_dim]`, float32 or bf16) at `(streams[t], positions[t])` of the logical `[stream, cell, kv_head,
head_dim]` views `k_dst` / `v_dst` (any strides, float32 / bf16 / float16), converting with
round-to-nearest-even as torch's `.to` does: the same bytes as `dst.index_put_((streams,
positions), src.to(dst.dtype))`, which is the fallback (no compiler, other devices, other dtypes).

Why: a decode step writes one row per layer; the torch form is two casts and two `index_put_`
(~13 us per layer at batch 1, ~0.4 ms of a ~8 ms step), the C form one call (~8 us with its
checks, ~4 us of it the ctypes call). Layouts
call it from `write`; it checks the indices against the views' shapes (an out-of-range stream or
position raises, as `index_put_` does, instead of writing outside the cache).
"""

from __future__ import annotations

import torch

from slotserver.lab import native

NATIVE_C = r"""
#if defined(__F16C__)
#include <immintrin.h>
#endif
/* float -> IEEE half, round to nearest even (torch's float16 cast): F16C where present, else the
   same result by integer arithmetic (normals), by lrintf on the 2^-24 grid (subnormals). */
static inline uint16_t f2h(float f) {
#if defined(__F16C__)
    return _cvtss_sh(f, 0);
#else
    union { float f; uint32_t u; } x; x.f = f;
    const uint32_t sign = (x.u >> 16) & 0x8000u, a = x.u & 0x7FFFFFFFu;
    if (a > 0x7F800000u) return (uint16_t)(sign | 0x7E00u | ((a >> 13) & 0x3FFu));   /* NaN stays NaN */
    if (a >= 0x477FF000u) return (uint16_t)(sign | 0x7C00u);                          /* >= 65520: inf */
    if (a < 0x38800000u) {                                                             /* < 2^-14 */
        union { uint32_t u; float f; } y; y.u = a;
        return (uint16_t)(sign | (uint32_t)lrintf(y.f * 16777216.0f));
    }
    return (uint16_t)(sign | ((a + 0x0FFFu + ((a >> 13) & 1u) - (112u << 23)) >> 13));
#endif
}

#if defined(__F16C__) && defined(__AVX2__)
/* 8 source values (float32, or bf16: sb) as floats. Why vectors: a decode step at 32 rows writes
   12 K values a layer, and the scalar conversion was ~1.3% of the step on one thread (`perf`). */
static inline __m256 load8f(const void *src, int64_t i, int sb) {
    return sb ? _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)((const uint16_t *)src + i))), 16))
              : _mm256_loadu_ps((const float *)src + i);
}
#endif

/* dst element type: 0 float32, 1 bf16, 2 float16; src: 0 float32, 1 bf16. Strides in elements:
   dst (stream, cell, head, dim=1), src (token, head, dim=1). -> 0, or 1 for an index out of range. */
static int put(void *dst, const void *src, const int64_t *streams, const int64_t *pos, int64_t T, int64_t H,
               int64_t D, int64_t ds, int64_t dc, int64_t dh, int64_t st, int64_t sh, int64_t S, int64_t C,
               int dt, int sb) {
    for (int64_t t = 0; t < T; t++) {
        const int64_t s = streams[t], p = pos[t];
        if (s < 0 || s >= S || p < 0 || p >= C) return 1;
        for (int64_t h = 0; h < H; h++) {
            const int64_t o = s * ds + p * dc + h * dh, i = t * st + h * sh;
            if (dt == 2) {
                int64_t d = 0;
#if defined(__F16C__) && defined(__AVX2__)
                for (; d + 8 <= D; d += 8)   /* the same bits as f2h's _cvtss_sh, 8 at a time */
                    _mm_storeu_si128((__m128i *)((uint16_t *)dst + o + d), _mm256_cvtps_ph(load8f(src, i + d, sb), 0));
#endif
                for (; d < D; d++) ((uint16_t *)dst)[o + d] = f2h(ld(src, i + d, sb));
            }
            else if (dt == 1) for (int64_t d = 0; d < D; d++) ((uint16_t *)dst)[o + d] = f2bf(ld(src, i + d, sb));
            else for (int64_t d = 0; d < D; d++) ((float *)dst)[o + d] = ld(src, i + d, sb);
        }
    }
    return 0;
}

int kv_write_rows(void *kd, void *vd, const void *k, const void *v, const int64_t *streams, const int64_t *pos,
                  int64_t T, int64_t H, int64_t D, int64_t kds, int64_t kdc, int64_t kdh, int64_t vds, int64_t vdc,
                  int64_t vdh, int64_t kst, int64_t ksh, int64_t vst, int64_t vsh, int64_t S, int64_t C,
                  int dt, int kb, int vb) {
    return put(kd, k, streams, pos, T, H, D, kds, kdc, kdh, kst, ksh, S, C, dt, kb)
        || put(vd, v, streams, pos, T, H, D, vds, vdc, vdh, vst, vsh, S, C, dt, vb);
}
"""
_LIB = native.build("kv_rows", NATIVE_C, origin=__file__)
native.signature(_LIB, "kv_write_rows", 6, 15, (native.ctypes.c_int,) * 3, replay=True)
_DST = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}
_SRC = (torch.float32, torch.bfloat16)


def write_rows(k_dst: torch.Tensor, v_dst: torch.Tensor, streams: torch.Tensor, positions: torch.Tensor,
               k: torch.Tensor, v: torch.Tensor, dst_ok: bool | None = None) -> None:
    """k_dst, v_dst: `[streams, cells, kv_heads, head_dim]` views; k, v: `[tokens, kv_heads, head_dim]`.
    dst_ok: `dst_native(k_dst, v_dst)` where the caller checked it once (a layout, at creation)."""
    if dst_ok is None:
        dst_ok = dst_native(k_dst, v_dst)
    if not (dst_ok and _src_native(k_dst, streams, positions, k, v)):
        k_dst.index_put_((streams, positions), k if k.dtype == k_dst.dtype else k.to(k_dst.dtype))
        v_dst.index_put_((streams, positions), v if v.dtype == v_dst.dtype else v.to(v_dst.dtype))
        return
    t, h, d = k.shape
    rc = _LIB.kv_write_rows(k_dst.data_ptr(), v_dst.data_ptr(), k.data_ptr(), v.data_ptr(), streams.data_ptr(),
                            positions.data_ptr(), t, h, d, *k_dst.stride()[:3], *v_dst.stride()[:3],
                            k.stride(0), k.stride(1), v.stride(0), v.stride(1), k_dst.shape[0], k_dst.shape[1],
                            _DST[k_dst.dtype], native.is_bf16(k), native.is_bf16(v))
    if rc:
        raise IndexError(f"KV write: a stream or position out of range (streams {streams.tolist()}, "
                         f"positions {positions.tolist()}, cache {tuple(k_dst.shape[:2])})")


def dst_native(k_dst: torch.Tensor, v_dst: torch.Tensor) -> bool:
    """Whether the C writes into these views (CPU, a float dtype, unit head_dim stride)."""
    return (_LIB is not None and k_dst.is_cpu and v_dst.is_cpu and k_dst.dtype in _DST and v_dst.dtype == k_dst.dtype
            and k_dst.dim() == 4 and v_dst.shape == k_dst.shape and k_dst.stride(3) == 1 and v_dst.stride(3) == 1)


def _src_native(k_dst, streams, positions, k, v) -> bool:
    return (k.dtype in _SRC and v.dtype in _SRC and k.is_cpu and v.is_cpu and k.dim() == 3 and v.shape == k.shape
            and k_dst.shape[2:] == k.shape[1:] and k.stride(2) == 1 and v.stride(2) == 1
            and streams.dtype == torch.int64 and positions.dtype == torch.int64 and streams.is_contiguous()
            and positions.is_contiguous() and streams.shape == positions.shape == k.shape[:1] and streams.is_cpu
            and positions.is_cpu)
