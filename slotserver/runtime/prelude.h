/* prelude.h: prepended to every native kernel's source by slotserver/runtime/native.py (its PRELUDE,
   with a #line directive pointing at this file): bf16 <-> float32, a vectorizable exp, row loads
   and prefetches, the AVX-512 (and AVX2) forms of loads, stores and exp, and the silu_mul and
   RMSNorm helpers that kernels/qmatmul.c shares with silu_mul.c and rms_norm.c.
   A tensor's dtype crosses the boundary as an int flag: 1 for bfloat16, 0 for float32. */
#include <math.h>
#include <stdint.h>
#include <string.h>

static inline float bf2f(uint16_t h) { union { uint32_t u; float f; } x; x.u = (uint32_t)h << 16; return x.f; }
static inline uint16_t f2bf(float f) {
    union { uint32_t u; float f; } x; x.f = f;
    if ((x.u & 0x7FFFFFFFu) > 0x7F800000u) return (uint16_t)((x.u >> 16) | 0x40u);   /* NaN stays a quiet NaN */
    return (uint16_t)((x.u + 0x7FFFu + ((x.u >> 16) & 1u)) >> 16);                  /* round to nearest even */
}
static inline float ld(const void *base, int64_t i, int bf16) {
    return bf16 ? bf2f(((const uint16_t *)base)[i]) : ((const float *)base)[i];
}
static inline void st(void *base, int64_t i, int bf16, float x) {
    if (bf16) ((uint16_t *)base)[i] = f2bf(x); else ((float *)base)[i] = x;
}
/* e^x as 2^t, t = x log2 e, split into 2^round(t) * 2^f, |f| <= 1/2, with Cephes' exp2f polynomial
   (relative error ~2e-7); x is clamped to [-87, 88]. Written out so that loops calling it vectorize. */
static inline float fast_exp(float x) {
    const float t = (x < -87.0f ? -87.0f : (x > 88.0f ? 88.0f : x)) * 1.4426950409f;
    const float n = floorf(t + 0.5f), f = t - n;
    const float p = 1.0f + f * (6.931472028550421e-1f + f * (2.402264791363012e-1f + f * (5.550332471162809e-2f
                    + f * (9.618437357674640e-3f + f * (1.339887440266574e-3f + f * 1.535336188319500e-4f)))));
    union { uint32_t u; float f; } e; e.u = (uint32_t)((int32_t)n + 127) << 23;
    return p * e.f;
}
/* fast_exp's polynomial in f by Horner's rule for a vector width (its multiply-add and broadcast). */
#define EXP2_POLY(fma, set1, f) \
    fma(fma(fma(fma(fma(fma(set1(1.535336188319500e-4f), f, set1(1.339887440266574e-3f)), f, \
        set1(9.618437357674640e-3f)), f, set1(5.550332471162809e-2f)), f, set1(2.402264791363012e-1f)), f, \
        set1(6.931472028550421e-1f)), f, set1(1.0f))
/* 16 lanes at a time where the compiler targets AVX-512 with BF16 (SLOT_AVX512): loads and stores
   of bf16 or float32, and fast_exp with the same polynomial. Kernels keep a scalar loop for the
   rest (and for other CPUs). */
#if defined(__AVX512F__) && defined(__AVX512BF16__)
#define SLOT_AVX512 1
#include <immintrin.h>
static inline __m512 load16(const void *p, int64_t i, int bf16) {
    return bf16 ? _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)((const uint16_t *)p + i))), 16))
                : _mm512_loadu_ps((const float *)p + i);
}
static inline void store16(void *p, int64_t i, int bf16, __m512 v) {
    if (bf16) _mm256_storeu_si256((__m256i *)((uint16_t *)p + i), (__m256i)_mm512_cvtneps_pbh(v));
    else _mm512_storeu_ps((float *)p + i, v);
}
static inline __m512 fast_exp16(__m512 x) {
    const __m512 t = _mm512_mul_ps(_mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.0f)), _mm512_set1_ps(88.0f)),
                                   _mm512_set1_ps(1.4426950409f));
    const __m512 n = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC), f = _mm512_sub_ps(t, n);
    return _mm512_scalef_ps(EXP2_POLY(_mm512_fmadd_ps, _mm512_set1_ps, f), n);
}
#endif
/* silu(g) * u in float32 (kernels/silu_mul.py, and qmatmul's fused prologue: one formula for both).
   The AVX-512 form avoids the division (the slowest vector instruction; GCC keeps it without
   -ffast-math): 1 / (1 + e) as rcp14 plus one Newton step (relative error ~1e-7). */
static inline float silu_mul1(float g, float u) { return g / (1.0f + fast_exp(-g)) * u; }
#ifdef SLOT_AVX512
static inline __m512 silu_mul16(__m512 g, __m512 u) {
    const __m512 den = _mm512_add_ps(_mm512_set1_ps(1.0f), fast_exp16(_mm512_sub_ps(_mm512_setzero_ps(), g)));
    __m512 r = _mm512_rcp14_ps(den);
    r = _mm512_mul_ps(r, _mm512_fnmadd_ps(den, r, _mm512_set1_ps(2.0f)));     /* Newton: r (2 - den r) */
    return _mm512_mul_ps(_mm512_mul_ps(g, r), u);
}
#endif
/* 8 lanes where the compiler targets AVX2 + FMA but not SLOT_AVX512 (SLOT_AVX2): the scalar forms'
   formulas lane by lane (floor(t + 1/2), the same polynomial, an IEEE division), so that a row's
   vector body and scalar tail agree to rounding. Why: gcc leaves silu_mul1's loop scalar (vdivss,
   vroundss), ~5% of an AVX2 decode step at batch 32 in qmatmul's fused prologue. */
#if !defined(SLOT_AVX512) && defined(__AVX2__) && defined(__FMA__)
#define SLOT_AVX2 1
#include <immintrin.h>
static inline __m256 load8(const void *p, int64_t i, int bf16) {
    return bf16 ? _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)((const uint16_t *)p + i))), 16))
                : _mm256_loadu_ps((const float *)p + i);
}
static inline void store8(void *p, int64_t i, int bf16, __m256 v) {
    if (bf16) { float f[8]; _mm256_storeu_ps(f, v); for (int j = 0; j < 8; j++) ((uint16_t *)p)[i + j] = f2bf(f[j]); }
    else _mm256_storeu_ps((float *)p + i, v);
}
static inline __m256 fast_exp8(__m256 x) {
    const __m256 t = _mm256_mul_ps(_mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.0f)), _mm256_set1_ps(88.0f)),
                                   _mm256_set1_ps(1.4426950409f));
    const __m256 n = _mm256_floor_ps(_mm256_add_ps(t, _mm256_set1_ps(0.5f))), f = _mm256_sub_ps(t, n);
    const __m256 p = EXP2_POLY(_mm256_fmadd_ps, _mm256_set1_ps, f);
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}
static inline __m256 silu_mul8(__m256 g, __m256 u) {
    const __m256 den = _mm256_add_ps(_mm256_set1_ps(1.0f), fast_exp8(_mm256_sub_ps(_mm256_setzero_ps(), g)));
    return _mm256_mul_ps(_mm256_div_ps(g, den), u);
}
#endif
/* RMSNorm's two halves, for kernels/rms_norm.py and qmatmul's fused prologue alike: 1 / rms of
   v[n] (+ eps), and o = v * r * w. Why here, `noipa`: each library then holds this very code (no
   clone specialised to its call sites, nothing inlined into a loop gcc vectorizes its own way),
   and the sum has 16 partial sums in a fixed lane order and a fixed tree, whatever v's alignment;
   left to gcc under -fassociative-math the two libraries summed in different orders on an
   AVX-512 Zen 5 host (fused and unfused norms 1 ulp apart). */
__attribute__((noipa, unused)) static float rms_inv(const float *v, int64_t n, float eps) {
    float s[16] = {0};
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) for (int j = 0; j < 16; j++) s[j] += v[i + j] * v[i + j];
    for (int j = 0; i < n; i++, j++) s[j] += v[i] * v[i];
    for (int h = 8; h > 0; h /= 2) for (int j = 0; j < h; j++) s[j] += s[j + h];
    return 1.0f / sqrtf(s[0] / (float)n + eps);
}
__attribute__((noipa, unused)) static void rms_apply(const float *v, float r, const void *w, int wb, int64_t n, float *o) {
    for (int64_t i = 0; i < n; i++) o[i] = v[i] * r * ld(w, i, wb);
}
static inline void load_row(const void *base, int64_t off, int bf16, int64_t n, float *dst) {
    if (bf16) { const uint16_t *p = (const uint16_t *)base + off; for (int64_t i = 0; i < n; i++) dst[i] = bf2f(p[i]); }
    else { const float *p = (const float *)base + off; for (int64_t i = 0; i < n; i++) dst[i] = p[i]; }
}
static inline void prefetch_row(const void *base, int64_t off, int bf16, int64_t n) {
    const char *p = (const char *)base + off * (bf16 ? 2 : 4);
    for (int64_t i = 0; i < n * (bf16 ? 2 : 4); i += 64) __builtin_prefetch(p + i);
}
/* AMX (kernels/q4_matmul.c, kernels/attention_amx.c): the tile configuration's memory form, and
   the tile data permission, which Linux grants per process on request (asked once, remembered). */
#if defined(__AMX_TILE__)
#include <sys/syscall.h>
#include <unistd.h>
typedef struct { uint8_t palette, start_row, reserved[14]; uint16_t colsb[16]; uint8_t rows[16]; } tile_config;
static int amx_state = 0;   /* 0 unknown, 1 granted, -1 refused */
__attribute__((unused)) static int amx_granted(void) {
    if (amx_state == 0) amx_state = syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XTILEDATA */) == 0 ? 1 : -1;
    return amx_state == 1;
}
#endif
