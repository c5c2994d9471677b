/* kv_rows.c: kv_write_rows of slotserver/runtime/kv_rows.py (what it writes, and why: that module's
   docstring). Compiled with native.PRELUDE (slotserver/runtime/prelude.h) in front. */
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
