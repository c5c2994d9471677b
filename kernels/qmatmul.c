/* qmatmul.c: the CPU kernel of kernels/qmatmul.py: how it computes (8-bit activations, the unpacked
   and the repacked weight forms, the tiles) is that module's docstring. Compiled with
   native.PRELUDE (slotserver/runtime/prelude.h) in front: its fused prologue calls the prelude's
   silu_mul1/8/16, rms_inv and rms_apply, the same code as kernels/silu_mul.c and rms_norm.c. */
#include <stdlib.h>
#if defined(__AVX2__) || defined(__F16C__)
#include <immintrin.h>
#endif
enum { Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8, Q2_K = 10, Q3_K = 11, Q4_K = 12, Q5_K = 13, Q6_K = 14,
       MXFP4 = 39 };
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
#define QM_VNNI 1
#endif
#if defined(QM_VNNI) && defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512DQ__)
#define QM_VNNI512 1   /* two 32-blocks per instruction: see dot_legacy_512 */
#endif

static inline float h2f(const uint8_t *p) {
    const uint16_t h = (uint16_t)(p[0] | (p[1] << 8));
#if defined(__F16C__)
    return _cvtsh_ss(h);
#else
    const uint32_t s = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1Fu, m = h & 0x3FFu;
    union { uint32_t u; float f; } x;
    if (e == 0) { const float v = (float)m * 5.9604644775390625e-8f; return s ? -v : v; }
    x.u = s | (e == 31 ? 0x7F800000u | (m << 13) : ((e + 112) << 23) | (m << 13));
    return x.f;
#endif
}

/* MXFP4 (gpt-oss's experts; ggml-common.h block_mxfp4: `u8 e, u8 qs[16]`, 17 B / 32): value =
   kvalues_mxfp4[nibble] * 2^(e - 128), the E2M1 values doubled times half the E8M0 scale, exactly
   ggml's GGML_E8M0_TO_FP32_HALF (e < 2 are float32 denormals; no NaN for 0xff, as ggml). Unpacked
   as u = kvalue + 12 (0..24, unsigned like the other 32-blocks) with the offset m = -12 d, so
   every path of the legacy formats serves it; R16_OFFSET folds the -12 into the integer sums. */
static const uint8_t MXFP4_U[16] = { 12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0 };
static inline float e8m0_half(uint8_t e) {
    union { uint32_t u; float f; } x;
    x.u = e < 2 ? 0x00200000u << e : (uint32_t)(e - 1) << 23;
    return x.f;
}
static inline uint8_t e8m0_of(float d) {   /* e8m0_half's inverse (d one of its values) */
    union { float f; uint32_t u; } x = { d };
    return x.u >= 0x00800000u ? (uint8_t)((x.u >> 23) + 1) : x.u == 0x00400000u;
}
/* u = kvalue + 12 -> its nibble (0 for 12: +0 and -0 are the same value), for the nibble form 8 */
static const uint8_t MXFP4_NIB[25] = { 15, 0, 0, 0, 14, 0, 13, 0, 12, 11, 10, 9, 0, 1, 2, 3, 4, 0, 5, 0, 6, 0, 0, 0, 7 };

/* One row's unpacked form: u[K] quants, and per 16 values (K-quants) sc/mn, per block d/dm.
   Legacy: value = d[b] * u + dm[b] (dm holds the offset or min); K: d[s]*sc[j]*u - dm[s]*mn[j]. */
typedef struct { uint8_t *u; int16_t *sc, *mn; float *d, *dm; } Row;

static inline void nibbles(const uint8_t *s, uint8_t *o, int n) {   /* n bytes -> lows then highs */
    for (int l = 0; l < n; l++) { o[l] = s[l] & 15; o[l + n] = s[l] >> 4; }
}

static void unpack_legacy(int type, const uint8_t *p, int64_t nb, int64_t bs, Row r) {
    for (int64_t b = 0; b < nb; b++, p += bs) {
        uint8_t *o = r.u + 32 * b;
        const int hm = type == Q4_1 || type == Q5_1, hi = type == Q5_0 || type == Q5_1;
        if (type == MXFP4) {
            r.d[b] = e8m0_half(p[0]); r.dm[b] = -12.0f * r.d[b];
            for (int l = 0; l < 16; l++) { o[l] = MXFP4_U[p[1 + l] & 15]; o[l + 16] = MXFP4_U[p[1 + l] >> 4]; }
            continue;
        }
        r.d[b] = h2f(p);
        if (type == Q8_0) { r.dm[b] = 0.0f; memcpy(o, p + 2, 32); continue; }
        r.dm[b] = hm ? h2f(p + 2) : r.d[b] * (hi ? -16.0f : -8.0f);
        nibbles(p + 2 + 2 * hm + 4 * hi, o, 16);
        if (hi) { uint32_t qh; memcpy(&qh, p + 2 + 2 * hm, 4); for (int l = 0; l < 32; l++) o[l] |= ((qh >> l) & 1u) << 4; }
    }
}

static inline void scale_min_k4(const uint8_t *s, int16_t *sc, int16_t *mn) {   /* 8 x 6-bit, each for 32 */
    for (int j = 0; j < 8; j++) {
        const int a = j < 4 ? s[j] & 63 : (s[j + 4] & 15) | ((s[j - 4] >> 6) << 4);
        const int m = j < 4 ? s[j + 4] & 63 : (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
        sc[2 * j] = sc[2 * j + 1] = (int16_t)a; mn[2 * j] = mn[2 * j + 1] = (int16_t)m;
    }
}

static void unpack_super(int type, const uint8_t *p, uint8_t *o, int16_t *sc, int16_t *mn, float *d, float *dm) {
    if (type == Q4_K || type == Q5_K) {
        *d = h2f(p); *dm = h2f(p + 2); scale_min_k4(p + 4, sc, mn);
        const uint8_t *qs = p + (type == Q4_K ? 16 : 48), *qh = p + 16;
        for (int c = 0; c < 4; c++) nibbles(qs + 32 * c, o + 64 * c, 32);
        if (type == Q5_K) for (int j = 0; j < 8; j++) for (int l = 0; l < 32; l++) o[32 * j + l] |= ((qh[l] >> j) & 1) << 4;
    } else if (type == Q6_K) {
        const uint8_t *ql = p, *qh = p + 128; const int8_t *s = (const int8_t *)(p + 192);
        *d = *dm = h2f(p + 208);
        for (int j = 0; j < 16; j++) { sc[j] = s[j]; mn[j] = (int16_t)(32 * s[j]); }
        for (int h = 0; h < 2; h++)        /* l innermost: contiguous, vectorizes */
            for (int l = 0; l < 32; l++) {
                const uint8_t a = ql[h * 64 + l], b = ql[h * 64 + 32 + l], c = qh[h * 32 + l];
                uint8_t *t = o + 128 * h + l;
                t[0] = (a & 15) | ((c & 3) << 4);         t[32] = (b & 15) | (((c >> 2) & 3) << 4);
                t[64] = (a >> 4) | (((c >> 4) & 3) << 4); t[96] = (b >> 4) | (((c >> 6) & 3) << 4);
            }
    } else if (type == Q3_K) {
        const uint8_t *hm = p, *qs = p + 32, *s = p + 96;
        *d = *dm = h2f(p + 108);
        for (int i = 0; i < 16; i++) {
            const int lo = (i < 8 ? s[i] : s[i - 8] >> 4) & 15, hi = (s[8 + (i & 3)] >> (2 * (i >> 2))) & 3;
            sc[i] = (int16_t)((lo | (hi << 4)) - 32); mn[i] = (int16_t)(4 * sc[i]);
        }
        for (int h = 0; h < 2; h++) for (int g = 0; g < 4; g++) for (int l = 0; l < 32; l++)
            o[128 * h + 32 * g + l] = (uint8_t)(((qs[32 * h + l] >> (2 * g)) & 3) | (((hm[l] >> (4 * h + g)) & 1) << 2));
    } else {   /* Q2_K */
        const uint8_t *s = p, *qs = p + 16;
        *d = h2f(p + 80); *dm = h2f(p + 82);
        for (int j = 0; j < 16; j++) { sc[j] = s[j] & 15; mn[j] = s[j] >> 4; }
        for (int h = 0; h < 2; h++) for (int g = 0; g < 4; g++) for (int l = 0; l < 32; l++)
            o[128 * h + 32 * g + l] = (qs[32 * h + l] >> (2 * g)) & 3;
    }
}

static void unpack_row(int type, const uint8_t *p, int64_t K, int64_t bs, Row r) {
    if (type == Q2_K || type == Q3_K || type == Q4_K || type == Q5_K || type == Q6_K) {
        for (int64_t s = 0; s < K / 256; s++)
            unpack_super(type, p + s * bs, r.u + 256 * s, r.sc + 16 * s, r.mn + 16 * s, r.d + s, r.dm + s);
    } else unpack_legacy(type, p, K / 32, bs, r);
}

/* Activations: per block of B (32 or 256) q = round(x / d), d = amax / 127; sums per 16 values.
   The vector forms compute exactly what the scalar loop does (the product x * (1/d) rounded half
   to even by the default MXCSR, clamped to +-127); they matter from a few rows on, where the
   scalar form was ~3 ns per value, up to half of a batched call. */
static void quantize_row(const float *x, int64_t K, int B, int8_t *q, float *d, int16_t *sums) {
    for (int64_t b = 0; b < K / B; b++) {
        const float *v = x + b * B; int8_t *o = q + b * B;
        float amax = 0.0f;
        int i = 0;
#if defined(__AVX512F__)
        __m512 mx = _mm512_setzero_ps();
        for (; i + 16 <= B; i += 16) mx = _mm512_max_ps(mx, _mm512_abs_ps(_mm512_loadu_ps(v + i)));
        amax = _mm512_reduce_max_ps(mx);
#elif defined(__AVX2__)   /* gcc calls libm's fmaxf for the scalar loop: ~15% of a 32-row call */
        __m256 mx = _mm256_setzero_ps();
        for (; i + 8 <= B; i += 8) mx = _mm256_max_ps(mx, _mm256_andnot_ps(_mm256_set1_ps(-0.0f), _mm256_loadu_ps(v + i)));
        __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
        m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        amax = _mm_cvtss_f32(_mm_max_ss(m4, _mm_movehdup_ps(m4)));
#endif
        for (; i < B; i++) amax = fmaxf(amax, fabsf(v[i]));
        const float dd = amax * (1.0f / 127.0f), id = dd > 0.0f ? 1.0f / dd : 0.0f;
        i = 0;
#if defined(__AVX512F__)
        const __m512 vid = _mm512_set1_ps(id);
        const __m512i lo = _mm512_set1_epi32(-127), hi = _mm512_set1_epi32(127);
        for (; i + 16 <= B; i += 16) {
            const __m512i qi = _mm512_min_epi32(hi, _mm512_max_epi32(lo, _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(v + i), vid))));
            _mm_storeu_si128((__m128i *)(o + i), _mm512_cvtsepi32_epi8(qi));
        }
#elif defined(__AVX2__)
        const __m256 vid = _mm256_set1_ps(id);
        for (; i + 32 <= B; i += 32) {   /* llama.cpp's quantize_row_q8_0 packing */
            __m256i qv[4];
            for (int j = 0; j < 4; j++) qv[j] = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(v + i + 8 * j), vid));
            __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(qv[0], qv[1]), _mm256_packs_epi32(qv[2], qv[3]));
            p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
            p = _mm256_max_epi8(p, _mm256_set1_epi8(-127));   /* packs saturates to -128..127 */
            _mm256_storeu_si256((__m256i *)(o + i), p);
        }
#endif
        for (; i < B; i++) o[i] = (int8_t)fminf(127.0f, fmaxf(-127.0f, nearbyintf(v[i] * id)));
        d[b] = dd;
    }
    for (int64_t j = 0; j < K / 16; j++) { int s = 0; for (int i = 0; i < 16; i++) s += q[16 * j + i]; sums[j] = (int16_t)s; }
}

#if defined(__AVX2__)
static inline __m256i dot_us(__m256i u, __m256i a) {          /* 8 x int32 sums of 4 u8*s8 products */
#if defined(QM_VNNI)
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, a);
#else
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, a), _mm256_set1_epi16(1));
#endif
}
static inline float hsum_ps(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s)); s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}
static inline int hsum_epi32(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E)); s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
    return _mm_cvtsi128_si32(s);
}
#endif

/* One weight row (unpacked) . one activation row, 32-blocks; sgn: Q8_0 (signed weights). */
static inline float dot_legacy(Row r, int64_t nb, int sgn, const int8_t *a, const float *da, const int16_t *as) {
    float acc = 0.0f, macc = 0.0f;
#if defined(__AVX2__)
    __m256 vacc = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        __m256i u = _mm256_loadu_si256((const __m256i *)(r.u + 32 * b)), x = _mm256_loadu_si256((const __m256i *)(a + 32 * b));
        if (sgn) { x = _mm256_sign_epi8(x, u); u = _mm256_sign_epi8(u, u); }
        vacc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot_us(u, x)), _mm256_set1_ps(r.d[b] * da[b]), vacc);
        macc += r.dm[b] * da[b] * (float)(as[2 * b] + as[2 * b + 1]);
    }
    acc = hsum_ps(vacc);
#else
    for (int64_t b = 0; b < nb; b++) {
        int s = 0;
        for (int i = 0; i < 32; i++) s += (sgn ? (int)(int8_t)r.u[32 * b + i] : (int)r.u[32 * b + i]) * a[32 * b + i];
        acc += r.d[b] * da[b] * (float)s;
        macc += r.dm[b] * da[b] * (float)(as[2 * b] + as[2 * b + 1]);
    }
#endif
    return acc + macc;
}

#if defined(__AVX2__)
/* The 32-block formats straight from their bytes (no row buffer): llama.cpp's register unpacking. */
static inline __m256i nibbles32(const uint8_t *qs) {
    const __m128i t = _mm_loadu_si128((const __m128i *)qs);
    return _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(t, 4), t), _mm256_set1_epi8(15));
}
static inline __m256i mxfp4_u32(const uint8_t *qs) {   /* 16 bytes of nibbles -> 32 u = kvalue + 12 */
    const __m256i lut = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)MXFP4_U));
    return _mm256_shuffle_epi8(lut, nibbles32(qs));
}
static inline __m256i fifth_bits(const uint8_t *qh) {    /* bit j of qh -> 0x10 in byte j */
    uint32_t x; memcpy(&x, qh, 4);
    const __m256i shuf = _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0);
    __m256i b = _mm256_shuffle_epi8(_mm256_set1_epi32((int)x), shuf);
    b = _mm256_or_si256(b, _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe));
    return _mm256_and_si256(_mm256_cmpeq_epi8(b, _mm256_set1_epi64x(-1)), _mm256_set1_epi8(16));
}
/* Up to QM_ROWS activation rows (`mc`) per weight row: each block is unpacked once for all of them
   (8, not 4: at 8 rows one pass instead of two, measured 1.3x faster per SmolLM2 decode step at b=8). */
#define QM_ROWS 8
static inline void dot_legacy_direct(int type, const uint8_t *p, int64_t nb, int64_t bs, const int8_t *a, int64_t K,
                                     const float *da, const int16_t *as, int mc, float *out) {
    const int hm = type == Q4_1 || type == Q5_1, hi = type == Q5_0 || type == Q5_1;
    __m256 vacc[QM_ROWS];
    float macc[QM_ROWS];
    for (int i = 0; i < QM_ROWS; i++) { vacc[i] = _mm256_setzero_ps(); macc[i] = 0.0f; }
    for (int64_t b = 0; b < nb; b++, p += bs) {
        const float d = type == MXFP4 ? e8m0_half(p[0]) : h2f(p);
        __m256i u;
        float m = 0.0f;
        if (type == Q8_0) u = _mm256_loadu_si256((const __m256i *)(p + 2));
        else if (type == MXFP4) { u = mxfp4_u32(p + 1); m = -12.0f * d; }
        else {
            u = nibbles32(p + 2 + 2 * hm + 4 * hi);
            if (hi) u = _mm256_or_si256(u, fifth_bits(p + 2 + 2 * hm));
            m = hm ? h2f(p + 2) : d * (hi ? -16.0f : -8.0f);
        }
        const __m256i ua = type == Q8_0 ? _mm256_sign_epi8(u, u) : u;
        for (int i = 0; i < QM_ROWS; i++) {
            if (i >= mc) break;
            __m256i x = _mm256_loadu_si256((const __m256i *)(a + i * K + 32 * b));
            if (type == Q8_0) x = _mm256_sign_epi8(x, u);
            const float dai = da[i * nb + b];
            vacc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot_us(ua, x)), _mm256_set1_ps(d * dai), vacc[i]);
            if (type != Q8_0) macc[i] += m * dai * (float)(as[i * (K / 16) + 2 * b] + as[i * (K / 16) + 2 * b + 1]);
        }
    }
    for (int i = 0; i < mc; i++) out[i] = hsum_ps(vacc[i]) + macc[i];
}
#if defined(QM_VNNI512)
/* AVX-512 VNNI, two 32-blocks per instruction (one zmm of 64 weights), up to QM_ROWS activation
   rows per pass. Every legacy format becomes `value = d*u + m` with u unsigned: Q8_0's signed
   weights are shifted by 128 (u = w ^ 0x80, m = -128 d), since AVX-512 has no vpsignb for the
   AVX2 path's sign trick. Per activation row, `dx` holds each block's scale repeated 8 times and
   `sx` its scale times its integer sum / 8, so that one row's two blocks need one dpbusd, one
   convert and two FMAs on 16 lanes: sum over lanes = sum_b d_b da_b dot_b + m_b da_b sum_b. */
static inline __m512 pair_ps(float a, float b) {
    return _mm512_insertf32x8(_mm512_castps256_ps512(_mm256_set1_ps(a)), _mm256_set1_ps(b), 1);
}
static inline __m256i block_u8(int type, const uint8_t *p, float *d, float *m) {
    const int hm = type == Q4_1 || type == Q5_1, hi = type == Q5_0 || type == Q5_1;
    if (type == MXFP4) { *d = e8m0_half(p[0]); *m = -12.0f * *d; return mxfp4_u32(p + 1); }
    *d = h2f(p);
    if (type == Q8_0) { *m = -128.0f * *d; return _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(p + 2)), _mm256_set1_epi8((char)0x80)); }
    __m256i u = nibbles32(p + 2 + 2 * hm + 4 * hi);
    if (hi) u = _mm256_or_si256(u, fifth_bits(p + 2 + 2 * hm));
    *m = hm ? h2f(p + 2) : *d * (hi ? -16.0f : -8.0f);
    return u;
}
static inline void dot_legacy_512_rows(int type, const uint8_t *p, int64_t nb, int64_t bs, const int8_t *a, int64_t K,
                                       const float *dx, const float *sx, int mc, float *out) {
    __m512 acc[QM_ROWS], accm[QM_ROWS];   /* two chains per row: the scaled dots and the min terms */
    for (int i = 0; i < QM_ROWS; i++) { acc[i] = _mm512_setzero_ps(); accm[i] = _mm512_setzero_ps(); }
    int64_t b = 0;
    for (; b + 2 <= nb; b += 2, p += 2 * bs) {
        float d0, m0, d1, m1;
        const __m256i u0 = block_u8(type, p, &d0, &m0), u1 = block_u8(type, p + bs, &d1, &m1);
        const __m512i u = _mm512_inserti64x4(_mm512_castsi256_si512(u0), u1, 1);
        const __m512 dd = pair_ps(d0, d1), mm = pair_ps(m0, m1);
        for (int i = 0; i < QM_ROWS; i++) {
            if (i >= mc) break;
            const __m512i x = _mm512_loadu_si512((const void *)(a + i * K + 32 * b));
            const __m512 dot = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(_mm512_setzero_si512(), u, x));
            const float *dxi = dx + (i * nb + b) * 8, *sxi = sx + (i * nb + b) * 8;
            acc[i] = _mm512_fmadd_ps(dot, _mm512_mul_ps(dd, _mm512_loadu_ps(dxi)), acc[i]);
            accm[i] = _mm512_fmadd_ps(mm, _mm512_loadu_ps(sxi), accm[i]);
        }
    }
    for (; b < nb; b++, p += bs) {     /* an odd last block: the low half of the registers */
        float d0, m0;
        const __m512i u = _mm512_castsi256_si512(block_u8(type, p, &d0, &m0));
        const __mmask16 lo = 0x00FF;
        for (int i = 0; i < QM_ROWS; i++) {
            if (i >= mc) break;
            const __m512i x = _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(a + i * K + 32 * b)));
            const __m512 dot = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(_mm512_setzero_si512(), u, x));
            const float *dxi = dx + (i * nb + b) * 8, *sxi = sx + (i * nb + b) * 8;
            /* mask3: lanes outside `lo` keep the accumulator (mask_fmadd would keep the first operand) */
            acc[i] = _mm512_mask3_fmadd_ps(dot, _mm512_mul_ps(_mm512_set1_ps(d0), _mm512_maskz_loadu_ps(lo, dxi)), acc[i], lo);
            acc[i] = _mm512_mask3_fmadd_ps(_mm512_set1_ps(m0), _mm512_maskz_loadu_ps(lo, sxi), acc[i], lo);
        }
    }
    for (int i = 0; i < mc; i++) out[i] = _mm512_reduce_add_ps(_mm512_add_ps(acc[i], accm[i]));
}

/* One activation row: four blocks per iteration into four independent accumulators (one FMA
   chain of 4-cycle latency per block pair left a single row at ~8 MACs per cycle). */
static inline void dot_legacy_512_1(int type, const uint8_t *p, int64_t nb, int64_t bs, const int8_t *a,
                                    const float *dx, const float *sx, float *out) {
    __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps(), m0 = _mm512_setzero_ps(), m1 = _mm512_setzero_ps();
    int64_t b = 0;
    for (; b + 4 <= nb; b += 4, p += 4 * bs) {
        float d[4], m[4];
        __m256i u[4];
        for (int j = 0; j < 4; j++) u[j] = block_u8(type, p + j * bs, &d[j], &m[j]);
        const __m512i ua = _mm512_inserti64x4(_mm512_castsi256_si512(u[0]), u[1], 1);
        const __m512i ub = _mm512_inserti64x4(_mm512_castsi256_si512(u[2]), u[3], 1);
        const __m512i xa = _mm512_loadu_si512((const void *)(a + 32 * b)), xb = _mm512_loadu_si512((const void *)(a + 32 * b + 64));
        const __m512 da = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(_mm512_setzero_si512(), ua, xa));
        const __m512 db = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(_mm512_setzero_si512(), ub, xb));
        a0 = _mm512_fmadd_ps(da, _mm512_mul_ps(pair_ps(d[0], d[1]), _mm512_loadu_ps(dx + 8 * b)), a0);
        a1 = _mm512_fmadd_ps(db, _mm512_mul_ps(pair_ps(d[2], d[3]), _mm512_loadu_ps(dx + 8 * b + 16)), a1);
        m0 = _mm512_fmadd_ps(pair_ps(m[0], m[1]), _mm512_loadu_ps(sx + 8 * b), m0);
        m1 = _mm512_fmadd_ps(pair_ps(m[2], m[3]), _mm512_loadu_ps(sx + 8 * b + 16), m1);
    }
    float rest = 0.0f;
    if (b < nb) dot_legacy_512_rows(type, p, nb - b, bs, a + 32 * b, 0, dx + 8 * b, sx + 8 * b, 1, &rest);
    *out = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(m0, m1))) + rest;
}

static inline void dot_legacy_512(int type, const uint8_t *p, int64_t nb, int64_t bs, const int8_t *a, int64_t K,
                                  const float *dx, const float *sx, int mc, float *out) {
    if (mc == 1) { dot_legacy_512_1(type, p, nb, bs, a, dx, sx, out); return; }
    dot_legacy_512_rows(type, p, nb, bs, a, K, dx, sx, mc, out);
}
/* mc a constant where it matters (1 row; a full pass of QM_ROWS): unrolled, accumulators in registers */
#define QM_CASE512(T_) case T_: if (mc == 1) dot_legacy_512(T_, p, nb, bs, a, K, dx, sx, 1, out); \
                                else if (mc == QM_ROWS) dot_legacy_512(T_, p, nb, bs, a, K, dx, sx, QM_ROWS, out); \
                                else dot_legacy_512(T_, p, nb, bs, a, K, dx, sx, mc, out); break;
static void legacy_rows_512(int type, const uint8_t *p, int64_t nb, int64_t bs, const int8_t *a, int64_t K,
                            const float *dx, const float *sx, int mc, float *out) {
    switch (type) { QM_CASE512(Q4_0) QM_CASE512(Q4_1) QM_CASE512(Q5_0) QM_CASE512(Q5_1) QM_CASE512(Q8_0) QM_CASE512(MXFP4) default: break; }
}
#endif

/* The same with `type` (and, for one activation row, `mc`) constants, so that the compiler drops
   the per-block format branches and keeps the accumulators in registers: a single decode row ran
   at 6-13 GFLOP/s through the generic form (33 cycles per block), llama.cpp's form needs ~10. */
#define QM_CASE(T_) case T_: if (mc == 1) dot_legacy_direct(T_, p, nb, bs, a, K, da, as, 1, out); \
                             else dot_legacy_direct(T_, p, nb, bs, a, K, da, as, mc, out); break;
static void legacy_rows(int type, const uint8_t *p, int64_t nb, int64_t bs, const int8_t *a, int64_t K,
                        const float *da, const int16_t *as, int mc, float *out) {
    switch (type) { QM_CASE(Q4_0) QM_CASE(Q4_1) QM_CASE(Q5_0) QM_CASE(Q5_1) QM_CASE(Q8_0) QM_CASE(MXFP4) default: break; }
}
#endif

/* One weight row (unpacked) . one activation row, 256-blocks: exact int32 per super-block. */
static inline float dot_k(Row r, int64_t ns, const int8_t *a, const float *da, const int16_t *as) {
    float acc = 0.0f;
    for (int64_t s = 0; s < ns; s++) {
        const uint8_t *u = r.u + 256 * s; const int8_t *x = a + 256 * s;
        const int16_t *sc = r.sc + 16 * s, *mn = r.mn + 16 * s, *bs = as + 16 * s;
        int isum = 0, msum = 0;
#if defined(__AVX2__)
        __m256i vi = _mm256_setzero_si256();
        for (int j = 0; j < 8; j++) {
            const __m256i p = _mm256_maddubs_epi16(_mm256_loadu_si256((const __m256i *)(u + 32 * j)),
                                                   _mm256_loadu_si256((const __m256i *)(x + 32 * j)));
            vi = _mm256_add_epi32(vi, _mm256_madd_epi16(p, _mm256_set_m128i(_mm_set1_epi16(sc[2 * j + 1]), _mm_set1_epi16(sc[2 * j]))));
        }
        isum = hsum_epi32(vi);
#else
        for (int j = 0; j < 16; j++) { int t = 0; for (int i = 0; i < 16; i++) t += u[16 * j + i] * x[16 * j + i]; isum += sc[j] * t; }
#endif
        for (int j = 0; j < 16; j++) msum += mn[j] * bs[j];
        acc += da[s] * (r.d[s] * (float)isum - r.dm[s] * (float)msum);
    }
    return acc;
}

static int is_k(int type) { return type == Q2_K || type == Q3_K || type == Q4_K || type == Q5_K || type == Q6_K; }

/* Every entry's activation rows (load, norm, GLU, quantize: qmatmul, qprologue, qmatmul_r16) run on
   both threads from this many elements: a decode step at 32 rows (M x K 18-49 K) ran them on one
   thread while the other spun, ~5% of the step; a row's float buffer lives on the stack up to
   ROW_STACK_BYTES, K ~6500 (a malloc + free per row was another ~3%, `perf`; 32 KiB leaves any
   thread's stack ample room). */
#define PROLOGUE_PARALLEL 8192
#define ROW_STACK_BYTES 32768

static Row row_alloc(int64_t K) {
    Row r = { malloc(K + 64), malloc(K / 16 * 2 * sizeof(int16_t) + 64), NULL, malloc(K / 32 * 2 * sizeof(float) + 64), NULL };
    r.mn = r.sc + K / 16; r.dm = r.d + K / 32;
    return r;
}
static void row_free(Row r) { free(r.u); free(r.sc); free(r.d); }

/* y[m, n] = sum_k x[m, k] W[n, k] (accum: y[m, n] += it); W rows `sw` bytes apart; x/y rows sx/sy
   elements apart. */
int qmatmul(const void *w, const void *x, void *y, int64_t M, int64_t N, int64_t K, int64_t sw, int64_t sx,
            int64_t sy, int64_t bs, int type, int xb, int yb, int accum, int n_threads) {
    const int B = is_k(type) ? 256 : 32;
    int8_t *q = malloc(M * K + 64); float *da = malloc(M * (K / B) * sizeof(float) + 64);
    int16_t *as = malloc(M * (K / 16) * sizeof(int16_t) + 64);
    if (!q || !da || !as) { free(q); free(da); free(as); return 1; }
    const size_t xbytes = K * sizeof(float);
    #pragma omp parallel for num_threads(n_threads) if (M >= 2 && M * K >= PROLOGUE_PARALLEL)
    for (int64_t m = 0; m < M; m++) {
        float on_stack[xbytes <= ROW_STACK_BYTES ? xbytes / sizeof(float) : 1];
        float *xf = xbytes <= ROW_STACK_BYTES ? on_stack : malloc(xbytes);
        load_row(x, m * sx, xb, K, xf);
        quantize_row(xf, K, B, q + m * K, da + m * (K / B), as + m * (K / 16));
        if (xf != on_stack) free(xf);
    }
    float *xd = NULL, *xm = NULL;
#if defined(QM_VNNI512)
    if (B == 32) {   /* per-lane scales for dot_legacy_512 (see there) */
        const int64_t nb = K / 32;
        xd = malloc(M * nb * 8 * sizeof(float) + 64); xm = malloc(M * nb * 8 * sizeof(float) + 64);
        if (!xd || !xm) { free(q); free(da); free(as); free(xd); free(xm); return 1; }
        for (int64_t j = 0; j < M * nb; j++) {
            const int64_t m = j / nb, b = j % nb;
            const float s = da[j] * (float)(as[m * (K / 16) + 2 * b] + as[m * (K / 16) + 2 * b + 1]) * 0.125f;
            for (int l = 0; l < 8; l++) { xd[8 * j + l] = da[j]; xm[8 * j + l] = s; }
        }
    }
#endif
    #pragma omp parallel num_threads(n_threads) if (N * K * (M < 8 ? M : 8) >= 32768)
    {
        Row r = row_alloc(K);
        #pragma omp for schedule(static)
        for (int64_t n = 0; n < N; n++) {
            const uint8_t *wr = (const uint8_t *)w + n * sw;
#if defined(__AVX2__)
            if (B == 32) {
                for (int64_t m = 0; m < M; m += QM_ROWS) {
                    float v[QM_ROWS]; const int mc = M - m < QM_ROWS ? (int)(M - m) : QM_ROWS;
#if defined(QM_VNNI512)
                    legacy_rows_512(type, wr, K / 32, bs, q + m * K, K, xd + m * (K / 32) * 8, xm + m * (K / 32) * 8, mc, v);
#else
                    legacy_rows(type, wr, K / 32, bs, q + m * K, K, da + m * (K / 32), as + m * (K / 16), mc, v);
#endif
                    for (int i = 0; i < mc; i++) {
                        const int64_t o = (m + i) * sy + n;
                        st(y, o, yb, accum ? ld(y, o, yb) + v[i] : v[i]);
                    }
                }
                continue;
            }
#endif
            unpack_row(type, wr, K, bs, r);
            for (int64_t m = 0; m < M; m++) {
                const int8_t *a = q + m * K; const float *d = da + m * (K / B); const int16_t *s = as + m * (K / 16);
                const float v = B == 256 ? dot_k(r, K / 256, a, d, s)
                              : type == Q8_0 ? dot_legacy(r, K / 32, 1, a, d, s) : dot_legacy(r, K / 32, 0, a, d, s);
                st(y, m * sy + n, yb, accum ? ld(y, m * sy + n, yb) + v : v);
            }
        }
        row_free(r);
    }
    free(q); free(da); free(as); free(xd); free(xm);
    return 0;
}

/* ---- Batched rows on repacked weights (`qrepack` / `qmatmul_r16`) ------------------------------
   The per-row dots above unpack a weight block once per pass of up to 8 activation rows and pay a
   convert and two FMAs per (row, block) for 32 products: from 2 rows on, their cost grows with M.
   Repacked, a 32-block of 16 weight rows is 8 vectors of 64 bytes, vector t holding values
   4t..4t+3 of each of the 16 rows (lane r = row r), so one dpbusd (AVX-512 VNNI; maddubs + madd on
   AVX2, two halves of 8 rows) does 4 products for 16 output rows and a block is 8 of them against
   the activation's four bytes broadcast; the block's scales then cost one convert and two FMAs per
   16 outputs. Values are unsigned (0..31, Q8_0 shifted by 128) with per-row float d and m
   (value = d*u + m), so every legacy format runs the same loop. The weight vectors stay in
   registers while up to R16_ROWS activation rows pass. Layout: U[g][b][t][r][4] bytes,
   D[g][b] = {d[16], m[16]} floats; rows padded to a multiple of 16 with zeros. Q4_K and Q5_K
   fit the same form (one 6-bit scale and min per 32: d = d_s*sc, m = -dmin_s*mn, exact in
   float32); their activations are then quantized per 32 like the legacy formats' (finer than
   q8_K's 256, so a little more accurate). */
/* activation rows per pass over a weight vector set: more rows reuse the 8 weight vectors longer
   (geomean over SmolLM2 shapes at 8 and 128 rows: AVX-512 250 / 370 / 406 GFLOP/s at 4 / 8 / 16;
   AVX2 173 / 192 / 193, whose 16 registers spill the accumulators either way) */
#define R16_ROWS 16
/* Software prefetch, PF_AHEAD (group, block)s ahead of the one computed: a model's weights stream
   from DRAM (they do not fit L3), and from 8 rows on the hardware prefetcher alone left the loop
   waiting on memory. Weights cycled past L3, AVX-512 VNNI Zen 5, Qwen 0.5B shapes, 2 threads:
   Q5_0 896 x 4864 at 16 / 32 rows 542 / 719 -> 911 / 995 GFLOP/s, Q8_0 49152 x 576 416 / 529 ->
   876 / 923, one row 72 -> 83; forced AVX2 1.02-2.6x (playground/qmatmul_bench.py --cold). Blocks
   of a thread's groups are contiguous, so the address past a group's end is its next group's. 8
   blocks ahead was 3-10% slower than 16, 32 the same. */
#define PF_AHEAD 16
static inline void r16_prefetch(const uint8_t *u, int64_t ub, const uint8_t *s, int64_t db) {
    for (int64_t l = 0; l < ub; l += 64) __builtin_prefetch(u + PF_AHEAD * ub + l, 0, 3);
    for (int64_t l = 0; l < db; l += 64) __builtin_prefetch(s + PF_AHEAD * db + l, 0, 3);
}
/* Activation rows per pass over a weight group: the AVX2 tiles keep their sums in memory between
   blocks, so a pass can take more rows and unpack each block (nibbles, fifth bits) fewer times. */
#if !defined(QM_VNNI512) && defined(__AVX2__)
#define PASS_ROWS 64   /* from C, one thread, 128 rows: Q5_0 1536 x 768 154 -> 168-176 GFLOP/s, Q4_K 176-179 -> 191 */
#else
#define PASS_ROWS R16_ROWS
#endif
/* Q4_0 / Q4_1 repacked at 4 bits (what a single decode row wants: it is bound by the bytes read,
   and this is the file's 0.625 bytes per weight, where the byte form above reads 1.25): vector j
   (j = 0..3, 64 bytes) holds values 4j..4j+3 of the 16 rows in its low nibbles and 4(j+4).. in its
   high ones; the scales d and m are float16 (what the file holds), S[g][b] = {d[16], m[16]}. */
static inline uint16_t f2h_exact(float f) {   /* f is a float16 value (from the file): no rounding */
    union { float f; uint32_t u; } v = { f };
    const uint32_t s = (v.u >> 16) & 0x8000u, m = v.u & 0x7FFFFFu;
    const int e = (int)((v.u >> 23) & 0xFF) - 112;
    if ((v.u & 0x7FFFFFFFu) == 0) return (uint16_t)s;
    if (e >= 31) return (uint16_t)(s | 0x7C00u);
    if (e <= 0) return (uint16_t)(s | ((m | 0x800000u) >> (14 - e)));
    return (uint16_t)(s | ((uint32_t)e << 10) | (m >> 13));
}
/* One 32-block's scale and offset (value = d*u + m) of an unpacked row, for the byte form; Q6_K
   (form 2) gives its two per-16 scales instead. */
static inline void block_scales(int type, Row r, int64_t b, float *d, float *m) {
    if (type == Q6_K) { *d = r.d[b / 8] * (float)r.sc[2 * b]; *m = r.d[b / 8] * (float)r.sc[2 * b + 1]; }
    else if (is_k(type)) { *d = r.d[b / 8] * (float)r.sc[2 * b]; *m = -r.dm[b / 8] * (float)r.mn[2 * b]; }  /* sc[2j] == sc[2j+1] */
    else { *d = r.d[b]; *m = type == Q8_0 ? -128.0f * r.d[b] : r.dm[b]; }
}

/* The repacked forms: 0 bytes, scale and min per 32 as float32; 1 4-bit values, float16 scales
   (Q4_0, Q4_1: the file's own); 2 bytes, a float32 scale per 16 (Q6_K); 3 5-bit values (nibbles
   plus a plane of fifth bits), float16 scales (Q5_0, Q5_1); 4 and 5 as 1 and 3 with float32 scales
   (Q4_K, Q5_K: d_s*sc and dmin_s*mn are exact in float32, not in float16); 6 as 0 with only the
   float16 d (Q8_0: m = -128 d, exact, made in the kernel; 1.0625 bytes per weight, the file's); 7 Q6_K's
   6-bit values as nibbles plus two bit planes (+16, +32), scales per 16 as the super-block's
   float16 d[16] and int8 sc0[16], sc1[16] (d*sc exact in float32: the same floats as form 2's;
   0.875 bytes per weight against 1.25); 8 MXFP4's file form: the nibbles (indices into
   MXFP4_U, looked up by one vpshufb a vector) and the E8M0 byte per row (d decoded in the kernel,
   m = -12 d): 0.53 bytes per weight, the file's, against form 5's 0.875. */
#define FORM_NIB(f) ((f) == 1 || (f) == 3 || (f) == 4 || (f) == 5 || (f) == 7 || (f) == 8)
#define FORM_UB(f) ((f) == 7 ? 384 : FORM_HI5(f) ? 320 : FORM_NIB(f) ? 256 : 512)   /* U bytes per (group, block) */
#define FORM_DB(f) ((f) == 8 ? 16 : (f) == 6 ? 32 : FORM_H16(f) || (f) == 7 ? 64 : 128)   /* scale bytes per (group, block) */
#define FORM_HI5(f) ((f) == 3 || (f) == 5)
#define FORM_H16(f) ((f) == 1 || (f) == 3 || (f) == 6)
/* W -> repacked `form`; rows past N are zeros. The 5-bit forms add a bit plane: after a block's
   256 bytes of nibbles, 8 uint64 masks, mask t's bit 4r+j the fifth bit of row r's value 4t+j
   (0.75 bytes per weight with float16 scales, 0.875 with float32, against the byte form's 1.25).
   One thread per 16-row group, so that a mask is written by one thread. -> 0, or 2 where a float16
   form's scale does not fit float16 (then use form 0). */
int qrepack(const void *w, uint8_t *U, void *D, int64_t N, int64_t K, int64_t sw, int64_t bs, int type, int form,
            int n_threads) {
    const int nib = FORM_NIB(form), hi5 = FORM_HI5(form), h16 = FORM_H16(form), hi6 = form == 7;
    const int64_t nb = K / 32, ng = (N + 15) / 16, ub = FORM_UB(form);
    int overflow = 0;
    #pragma omp parallel num_threads(n_threads) reduction(|: overflow)
    {
        Row r = row_alloc(K);
        #pragma omp for schedule(static)
        for (int64_t g = 0; g < ng; g++) {
            if (hi5 || hi6) for (int64_t b = 0; b < nb; b++) memset(U + (g * nb + b) * ub + 256, 0, hi6 ? 128 : 64);
            for (int64_t lane = 0; lane < 16; lane++) {
                const int64_t n = g * 16 + lane;
                if (n < N) unpack_row(type, (const uint8_t *)w + n * sw, K, bs, r);
                for (int64_t b = 0; b < nb; b++) {
                    uint8_t *u = U + (g * nb + b) * ub + lane * 4;
                    uint64_t *mask = (uint64_t *)(U + (g * nb + b) * ub + 256);
                    float d = 0.0f, m = 0.0f;
                    if (n < N) block_scales(type, r, b, &d, &m);
                    /* four values at a time as one uint32 (values 4t..4t+3 of this row) */
                    uint32_t x[8] = {0};
                    if (n < N) memcpy(x, r.u + 32 * b, 32);
                    if (form == 8 && n < N)   /* the values' nibbles back (rows past N: nibble 0, value 0) */
                        for (int t = 0; t < 8; t++) {
                            uint8_t *c = (uint8_t *)&x[t];
                            for (int j = 0; j < 4; j++) c[j] = MXFP4_NIB[c[j]];
                        }
                    if (nib)
                        for (int t = 0; t < 4; t++) {
                            const uint32_t o = (x[t] & 0x0F0F0F0Fu) | ((x[t + 4] & 0x0F0F0F0Fu) << 4);
                            memcpy(u + t * 64, &o, 4);
                        }
                    else
                        for (int t = 0; t < 8; t++) {
                            const uint32_t o = type == Q8_0 && n < N ? x[t] ^ 0x80808080u : x[t];
                            memcpy(u + t * 64, &o, 4);
                        }
                    /* bit k of each of the 4 bytes -> 4 bits (byte j's at bit j): no carries between
                       the multiply's terms, each lands on its own bit */
#define BITS4(v, k) ((uint64_t)(((((v) >> (k)) & 0x01010101u) * 0x01020408u) >> 24) & 15u)
                    if (hi5 || hi6) for (int t = 0; t < 8; t++) mask[t] |= BITS4(x[t], 4) << (4 * lane);
                    if (hi6) for (int t = 0; t < 8; t++) mask[t + 8] |= BITS4(x[t], 5) << (4 * lane);
#undef BITS4
                    if (hi6) {   /* d_s (float16, exact) and the two int8 scales of the block */
                        uint8_t *e = (uint8_t *)D + (g * nb + b) * 64;
                        ((uint16_t *)e)[lane] = n < N ? f2h_exact(r.d[b / 8]) : 0;
                        e[32 + lane] = n < N ? (uint8_t)(int8_t)r.sc[2 * b] : 0;
                        e[48 + lane] = n < N ? (uint8_t)(int8_t)r.sc[2 * b + 1] : 0;
                    } else if (form == 8) {   /* MXFP4: the E8M0 byte (rows past N: 0, their nibbles are 0) */
                        ((uint8_t *)D)[(g * nb + b) * 16 + lane] = n < N ? e8m0_of(d) : 0;
                    } else if (form == 6) {   /* d only: the file's float16, always exact */
                        ((uint16_t *)D)[(g * nb + b) * 16 + lane] = f2h_exact(d);
                    } else if (h16) {   /* Q4_0's m = -8 d and Q5_0's -16 d can pass float16's range */
                        uint16_t *sc = (uint16_t *)D + (g * nb + b) * 32 + lane; sc[0] = f2h_exact(d); sc[16] = f2h_exact(m);
                        overflow |= fabsf(d) > 65504.0f || fabsf(m) > 65504.0f;
                    }
                    else { float *sc = (float *)D + (g * nb + b) * 32 + lane; sc[0] = d; sc[16] = m; }
                }
            }
        }
        row_free(r);
    }
    return overflow ? 2 : 0;
}

#if defined(QM_VNNI512)
/* Up to R16_ROWS activation rows against one (group, block): 8 dpbusd each, in two chains. */
static inline void r16_rows_512(const __m512i *wv, __m512 dv, __m512 mv, const int8_t *a, int64_t K, const float *da,
                                const float *ds, const int32_t *xo, int64_t nb, int64_t b, int mc, __m512 *acc) {
    for (int i = 0; i < R16_ROWS; i++) {
        if (i >= mc) break;
        const int32_t *x4 = (const int32_t *)(a + i * K + 32 * b);
        const __m512i s00 = xo ? _mm512_set1_epi32(xo[i * nb + b]) : _mm512_setzero_si512();
        __m512i s0 = _mm512_dpbusd_epi32(s00, wv[0], _mm512_set1_epi32(x4[0]));
        __m512i s1 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), wv[1], _mm512_set1_epi32(x4[1]));
        s0 = _mm512_dpbusd_epi32(s0, wv[2], _mm512_set1_epi32(x4[2]));
        s1 = _mm512_dpbusd_epi32(s1, wv[3], _mm512_set1_epi32(x4[3]));
        s0 = _mm512_dpbusd_epi32(s0, wv[4], _mm512_set1_epi32(x4[4]));
        s1 = _mm512_dpbusd_epi32(s1, wv[5], _mm512_set1_epi32(x4[5]));
        s0 = _mm512_dpbusd_epi32(s0, wv[6], _mm512_set1_epi32(x4[6]));
        s1 = _mm512_dpbusd_epi32(s1, wv[7], _mm512_set1_epi32(x4[7]));
        const __m512 dot = _mm512_cvtepi32_ps(_mm512_add_epi32(s0, s1));
        acc[i] = _mm512_fmadd_ps(dot, _mm512_mul_ps(dv, _mm512_set1_ps(da[i * nb + b])), acc[i]);
        if (!xo) acc[i] = _mm512_fmadd_ps(mv, _mm512_set1_ps(ds[i * nb + b]), acc[i]);
    }
}
/* Form 2 (Q6_K: a scale per 16 values, value = d16 * (u - 32)): the two halves of a block in
   their own chains, the offset taken out in int32 with the activation's sums per 16. */
static inline void r16_rows16_512(const __m512i *wv, __m512 d0, __m512 d1, const int8_t *a, int64_t K, const float *da,
                                  const int16_t *as, int64_t nb, int64_t b, int mc, __m512 *acc) {
    for (int i = 0; i < R16_ROWS; i++) {
        if (i >= mc) break;
        const int32_t *x4 = (const int32_t *)(a + i * K + 32 * b);
        __m512i s0 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), wv[0], _mm512_set1_epi32(x4[0]));
        __m512i s1 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), wv[4], _mm512_set1_epi32(x4[4]));
        for (int t = 1; t < 4; t++) {
            s0 = _mm512_dpbusd_epi32(s0, wv[t], _mm512_set1_epi32(x4[t]));
            s1 = _mm512_dpbusd_epi32(s1, wv[t + 4], _mm512_set1_epi32(x4[t + 4]));
        }
        const int16_t *si = as + i * (K / 16) + 2 * b;
        s0 = _mm512_sub_epi32(s0, _mm512_set1_epi32(32 * si[0]));
        s1 = _mm512_sub_epi32(s1, _mm512_set1_epi32(32 * si[1]));
        const __m512 dai = _mm512_set1_ps(da[i * nb + b]);
        acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s0), _mm512_mul_ps(d0, dai), acc[i]);
        acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s1), _mm512_mul_ps(d1, dai), acc[i]);
    }
}
/* A (group, block) of a repacked form as 8 byte vectors (values 0..63, vector t = values 4t..4t+3 of
   the 16 rows) and its float32 d and m per row (form 2 / 7: d of the two halves of 16). */
static inline void r16_unpack_512(int form, const uint8_t *u, const void *sc, __m512i *wv, __m512 *dv, __m512 *mv) {
    if (FORM_NIB(form)) {
        const __m512i lo = _mm512_set1_epi8(15);
        for (int j = 0; j < 4; j++) {
            const __m512i v = _mm512_loadu_si512((const void *)(u + 64 * j));
            wv[j] = _mm512_and_si512(v, lo); wv[j + 4] = _mm512_and_si512(_mm512_srli_epi16(v, 4), lo);
        }
        if (FORM_HI5(form)) {   /* the fifth bits: + 16 in the bytes that mask t selects (a masked add: one
                              instruction a vector, where expanding the mask to bytes took three) */
            const uint64_t *mk = (const uint64_t *)(u + 256);
            const __m512i sixteen = _mm512_set1_epi8(16);
            for (int t = 0; t < 8; t++) wv[t] = _mm512_mask_add_epi8(wv[t], (__mmask64)mk[t], wv[t], sixteen);
        }
        if (form == 8) {   /* MXFP4: nibble -> kvalue + 12 */
            const __m512i lut = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)MXFP4_U));
            for (int t = 0; t < 8; t++) wv[t] = _mm512_shuffle_epi8(lut, wv[t]);
        }
        if (form == 7) {   /* Q6_K's two high bits: + 16 and + 32 by their masks */
            const uint64_t *mk = (const uint64_t *)(u + 256);
            const __m512i sixteen = _mm512_set1_epi8(16), thirty2 = _mm512_set1_epi8(32);
            for (int t = 0; t < 8; t++) {
                wv[t] = _mm512_mask_add_epi8(wv[t], (__mmask64)mk[t], wv[t], sixteen);
                wv[t] = _mm512_mask_add_epi8(wv[t], (__mmask64)mk[t + 8], wv[t], thirty2);
            }
        }
    } else for (int t = 0; t < 8; t++) wv[t] = _mm512_loadu_si512((const void *)(u + 64 * t));
    if (form == 7) {   /* d * sc in float32: exact, form 2's floats */
        const __m512 dh = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)sc));
        const int8_t *s8 = (const int8_t *)sc + 32;
        *dv = _mm512_mul_ps(dh, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)s8))));
        *mv = _mm512_mul_ps(dh, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(s8 + 16)))));
    } else if (form == 6) {   /* Q8_0: m = -128 d (exact in float32, form 0's m) */
        *dv = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)sc));
        *mv = _mm512_mul_ps(*dv, _mm512_set1_ps(-128.0f));
    } else if (form == 8) {   /* MXFP4: e8m0_half of each row's byte, m = -12 d (both exact) */
        const __m512i e = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)sc));
        const __m512i normal = _mm512_slli_epi32(_mm512_sub_epi32(e, _mm512_set1_epi32(1)), 23);
        const __m512i denormal = _mm512_sllv_epi32(_mm512_set1_epi32(0x00200000), e);
        *dv = _mm512_castsi512_ps(_mm512_mask_blend_epi32(_mm512_cmplt_epu32_mask(e, _mm512_set1_epi32(2)), normal, denormal));
        *mv = _mm512_mul_ps(*dv, _mm512_set1_ps(-12.0f));
    } else if (FORM_H16(form)) {
        *dv = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)sc));
        *mv = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)((const uint16_t *)sc + 16)));
    } else { *dv = _mm512_loadu_ps((const float *)sc); *mv = _mm512_loadu_ps((const float *)sc + 16); }
}
static inline void r16_block_512(int form, const uint8_t *u, const void *sc, const int8_t *a, int64_t K, const float *da,
                                 const float *ds, const int32_t *xo, const int16_t *as, int64_t nb, int64_t b, int mc,
                                 __m512 *acc) {
    __m512i wv[8];
    __m512 dv, mv;
    r16_unpack_512(form, u, sc, wv, &dv, &mv);
    if (form == 2 || form == 7) r16_rows16_512(wv, dv, mv, a, K, da, as, nb, b, mc, acc);
    else r16_rows_512(wv, dv, mv, a, K, da, ds, xo, nb, b, mc, acc);
}

/* ---- Tiles of many rows (AVX-512 VNNI, every form but Q6_K's) -------------------------------------
   The loop above keeps one group's block in registers while 16 rows pass: one broadcast per dpbusd,
   and each block unpacked again for every 16 rows. From T512_MIN_ROWS rows a thread instead unpacks
   two groups (all of K) once into bytes and float32 scales in its own buffer (L1/L2), then passes
   T512_ROWS rows at a time over them with the T512_ROWS x 2 sums in registers: a broadcast feeds two
   dpbusd and the weights come from cache. Each row's arithmetic is the loop above's (integer sums
   per block, its convert and two FMAs, blocks in order): the same floats at every M.
   Each row tile prefetches its share of the next pair's bytes, so that unpacking that pair does
   not wait on DRAM (without it, 32 rows ran 0.84-1.06x the 16-row loop's speed; with it 0.87-1.09x).
   A C model of the loop (form 0, one thread, weights in cache, K 896, N 1536, 96 rows): 690 -> 818
   GOPS (a core's dpbusd peak measured 1075: 8.4 G a second, ~2 a cycle on Zen 5; without the
   epilogue the model reaches it);
   4 or 8 rows x 2 groups, 3 x 4, 4 x 3 were slower, and so was the epilogue of block b - 1 moved
   into block b's dpbusd. In qmatmul_r16, 2 threads, weights from DRAM (qmatmul_bench.py --cold,
   with the offset folding and the quantization into place): 1.04-1.37x at 32-512 rows on the
   SmolLM2 and 0.5B shapes, but 0.92-0.97x at 32 rows of K 1536 x N 576; 16 rows lost 10-30% (so
   T512_MIN_ROWS). */
#define T512_ROWS 6
#define T512_MIN_ROWS 32
static inline __attribute__((always_inline)) void t512_tile(const uint8_t *W, const float *S, int64_t nb,
        const int8_t *a, const float *da, const float *ds, const int32_t *xo, const int R, const int G, float (*out)[32],
        const uint8_t *pu, int64_t pub, const uint8_t *pd, int64_t pdb) {
    __m512 acc[T512_ROWS][2];
    for (int i = 0; i < R; i++) for (int j = 0; j < G; j++) acc[i][j] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *wb = W + b * G * 512;
        if (pu) {
            for (int64_t l = 0; l < pub; l += 64) __builtin_prefetch(pu + b * pub + l, 0, 3);
            for (int64_t l = 0; l < pdb; l += 64) __builtin_prefetch(pd + b * pdb + l, 0, 3);
        }
        __m512i s[T512_ROWS][2];
        for (int i = 0; i < R; i++)
            for (int j = 0; j < G; j++) s[i][j] = xo ? _mm512_set1_epi32(xo[b * R + i]) : _mm512_setzero_si512();
        for (int t = 0; t < 8; t++) {
            __m512i w[2];
            for (int j = 0; j < G; j++) w[j] = _mm512_load_si512((const void *)(wb + j * 512 + 64 * t));
            for (int i = 0; i < R; i++) {
                const __m512i xb = _mm512_set1_epi32(((const int32_t *)(a + (b * R + i) * 32))[t]);
                for (int j = 0; j < G; j++) s[i][j] = _mm512_dpbusd_epi32(s[i][j], w[j], xb);
            }
        }
        for (int j = 0; j < G; j++) {
            const __m512 d = _mm512_load_ps(S + (b * G + j) * 32), m = _mm512_load_ps(S + (b * G + j) * 32 + 16);
            for (int i = 0; i < R; i++) {
                acc[i][j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s[i][j]), _mm512_mul_ps(d, _mm512_set1_ps(da[b * R + i])), acc[i][j]);
                if (!xo) acc[i][j] = _mm512_fmadd_ps(m, _mm512_set1_ps(ds[b * R + i]), acc[i][j]);
            }
        }
    }
    for (int i = 0; i < R; i++) for (int j = 0; j < G; j++) _mm512_storeu_ps(out[i] + 16 * j, acc[i][j]);
}
/* Groups g0, g0 + 1 (G of them) unpacked into W [nb][G][512] bytes and S [nb][G][32] floats (d, m),
   read in file order (a group's blocks are contiguous, so is the next group) with the prefetch. */
static void t512_unpack(int form, const uint8_t *U, const uint8_t *D, int64_t ub, int64_t db, int64_t nb,
                        int64_t g0, int G, uint8_t *W, float *S) {
    for (int j = 0; j < G; j++)
        for (int64_t b = 0; b < nb; b++) {
            const int64_t o = (g0 + j) * nb + b;
            __m512i wv[8];
            __m512 dv, mv;
            r16_prefetch(U + o * ub, ub, D + o * db, db);
            r16_unpack_512(form, U + o * ub, D + o * db, wv, &dv, &mv);
            for (int t = 0; t < 8; t++) _mm512_store_si512((void *)(W + (b * G + j) * 512 + 64 * t), wv[t]);
            _mm512_store_ps(S + (b * G + j) * 32, dv); _mm512_store_ps(S + (b * G + j) * 32 + 16, mv);
        }
}
#define T512_CASE(R_) case R_: \
    if (xo) { if (G == 2) t512_tile(W, S, nb, a, da, ds, xo, R_, 2, out, pu, pub, pd, pdb); else t512_tile(W, S, nb, a, da, ds, xo, R_, 1, out, pu, pub, pd, pdb); } \
    else { if (G == 2) t512_tile(W, S, nb, a, da, ds, NULL, R_, 2, out, pu, pub, pd, pdb); else t512_tile(W, S, nb, a, da, ds, NULL, R_, 1, out, pu, pub, pd, pdb); } \
    break;
/* A tile of R rows against the unpacked groups: their sums into out [R][32]. The tile's activations
   are interleaved by block, a [nb][R][32] bytes, da, ds and xo [nb][R] (t512_at): one pointer
   each, where rows at stride K took a register per row and spilled. */
static void t512_rows(const uint8_t *W, const float *S, int64_t nb, int G, const int8_t *a, const float *da,
                      const float *ds, const int32_t *xo, int R, float (*out)[32], const uint8_t *pu, int64_t pub,
                      const uint8_t *pd, int64_t pdb) {
    switch (R) { T512_CASE(1) T512_CASE(2) T512_CASE(3) T512_CASE(4) T512_CASE(5) T512_CASE(6) }
}
#endif

#if !defined(QM_VNNI512) && defined(__AVX2__)
/* AVX2: each 16-row vector as two halves of 8 rows; maddubs + madd per 4 products. maddubs adds
   two u8*s8 products into int16 with saturation: 5-bit values are safe (4 sums of 2*31*127 <
   32767), Q8_0's shifted bytes are not: form 6 takes the signed bytes back and multiplies |w| by
   x * sign(w), llama.cpp's trick (a pair of 128*127 products fits). */
/* Rows 8h..8h+7 of one (group, block) in `form` (not 6) as 8 vectors of unsigned bytes, vector t
   holding values 4t..4t+3 of each row, and their scales dv and mins (or Q6_K's second scales) mv. */
static inline void r16_half_avx2(int form, const uint8_t *u, const void *sc, int h, __m256i *wv, __m256 *dv, __m256 *mv) {
    const __m256i lo = _mm256_set1_epi8(15);
    if (FORM_NIB(form)) {
        for (int j = 0; j < 4; j++) {
            const __m256i v = _mm256_loadu_si256((const __m256i *)(u + 64 * j + 32 * h));
            wv[j] = _mm256_and_si256(v, lo); wv[j + 4] = _mm256_and_si256(_mm256_srli_epi16(v, 4), lo);
        }
        if (FORM_HI5(form))   /* rows 8h..8h+7 of mask t are its 32-bit half h */
            for (int t = 0; t < 8; t++) wv[t] = _mm256_or_si256(wv[t], fifth_bits(u + 256 + 8 * t + 4 * h));
        if (form == 8) {   /* MXFP4: nibble -> kvalue + 12; d = e8m0_half(e), m = -12 d */
            const __m256i lut = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)MXFP4_U));
            for (int t = 0; t < 8; t++) wv[t] = _mm256_shuffle_epi8(lut, wv[t]);
            const __m256i e = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)((const uint8_t *)sc + 8 * h)));
            const __m256i normal = _mm256_slli_epi32(_mm256_sub_epi32(e, _mm256_set1_epi32(1)), 23);
            const __m256i denormal = _mm256_sllv_epi32(_mm256_set1_epi32(0x00200000), e);
            *dv = _mm256_castsi256_ps(_mm256_blendv_epi8(normal, denormal, _mm256_cmpgt_epi32(_mm256_set1_epi32(2), e)));
            *mv = _mm256_mul_ps(*dv, _mm256_set1_ps(-12.0f));
            return;
        }
    } else for (int t = 0; t < 8; t++) wv[t] = _mm256_loadu_si256((const __m256i *)(u + 64 * t + 32 * h));
#if defined(__F16C__)
    if (FORM_H16(form)) {
        *dv = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)sc + 8 * h)));
        *mv = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)sc + 16 + 8 * h)));
        return;
    }
#endif
    *dv = _mm256_loadu_ps((const float *)sc + 8 * h); *mv = _mm256_loadu_ps((const float *)sc + 16 + 8 * h);
}
/* The same for Q8_0's form 6 (u = w + 128): the signed bytes w back, |w|, and the float16 d. */
static inline void r16_half_q8_avx2(const uint8_t *u, const void *sc, int h, __m256i *w, __m256i *aw, __m256 *dv) {
    for (int t = 0; t < 8; t++) {
        w[t] = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(u + 64 * t + 32 * h)), _mm256_set1_epi8((char)0x80));
        aw[t] = _mm256_abs_epi8(w[t]);
    }
    *dv = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)sc + 8 * h)));
}
static inline void r16_block_avx2(int form, const uint8_t *u, const void *sc, const int8_t *a, int64_t K,
                                  const float *da, const float *ds, const int16_t *as, int64_t nb, int64_t b, int mc,
                                  __m256 *acc) {
    const __m256i ones = _mm256_set1_epi16(1);
    if (form == 6) {   /* Q8_0: maddubs on |w| and x * sign(w) */
        for (int h = 0; h < 2; h++) {
            __m256i w[8], aw[8];
            __m256 dv;
            r16_half_q8_avx2(u, sc, h, w, aw, &dv);
            for (int i = 0; i < PASS_ROWS; i++) {
                if (i >= mc) break;
                const int32_t *x4 = (const int32_t *)(a + i * K + 32 * b);
                __m256i s = _mm256_setzero_si256();
                for (int t = 0; t < 8; t++)   /* a pair is at most 2*128*127 < 32767: one madd per maddubs */
                    s = _mm256_add_epi32(s, _mm256_madd_epi16(
                        _mm256_maddubs_epi16(aw[t], _mm256_sign_epi8(_mm256_set1_epi32(x4[t]), w[t])), ones));
                __m256 *o = acc + 2 * i + h;
                *o = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_mul_ps(dv, _mm256_set1_ps(da[i * nb + b])), *o);
            }
        }
        return;
    }
    for (int h = 0; h < 2; h++) {
        __m256i wv[8];
        __m256 dv, mv;
        r16_half_avx2(form, u, sc, h, wv, &dv, &mv);
        for (int i = 0; i < PASS_ROWS; i++) {
            if (i >= mc) break;
            const int32_t *x4 = (const int32_t *)(a + i * K + 32 * b);
            __m256i s0 = _mm256_maddubs_epi16(wv[0], _mm256_set1_epi32(x4[0]));
            __m256i s1 = _mm256_maddubs_epi16(wv[1], _mm256_set1_epi32(x4[1]));
            s0 = _mm256_add_epi16(s0, _mm256_maddubs_epi16(wv[2], _mm256_set1_epi32(x4[2])));
            s1 = _mm256_add_epi16(s1, _mm256_maddubs_epi16(wv[3], _mm256_set1_epi32(x4[3])));
            __m256i s2 = _mm256_maddubs_epi16(wv[4], _mm256_set1_epi32(x4[4]));
            __m256i s3 = _mm256_maddubs_epi16(wv[5], _mm256_set1_epi32(x4[5]));
            s2 = _mm256_add_epi16(s2, _mm256_maddubs_epi16(wv[6], _mm256_set1_epi32(x4[6])));
            s3 = _mm256_add_epi16(s3, _mm256_maddubs_epi16(wv[7], _mm256_set1_epi32(x4[7])));
            __m256 *o = acc + 2 * i + h;
            if (form == 2) {   /* 6-bit values: two maddubs per int16 at most (2*2*63*127 < 32767) */
                const int16_t *si = as + i * (K / 16) + 2 * b;
                const __m256i lo16 = _mm256_sub_epi32(_mm256_add_epi32(_mm256_madd_epi16(s0, ones), _mm256_madd_epi16(s1, ones)),
                                                      _mm256_set1_epi32(32 * si[0]));
                const __m256i hi16 = _mm256_sub_epi32(_mm256_add_epi32(_mm256_madd_epi16(s2, ones), _mm256_madd_epi16(s3, ones)),
                                                      _mm256_set1_epi32(32 * si[1]));
                const __m256 dai = _mm256_set1_ps(da[i * nb + b]);
                *o = _mm256_fmadd_ps(_mm256_cvtepi32_ps(lo16), _mm256_mul_ps(dv, dai), *o);
                *o = _mm256_fmadd_ps(_mm256_cvtepi32_ps(hi16), _mm256_mul_ps(mv, dai), *o);
                continue;
            }
            const __m256i s = _mm256_add_epi32(_mm256_madd_epi16(_mm256_add_epi16(s0, s1), ones),
                                               _mm256_madd_epi16(_mm256_add_epi16(s2, s3), ones));
            *o = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_mul_ps(dv, _mm256_set1_ps(da[i * nb + b])), *o);
            *o = _mm256_fmadd_ps(mv, _mm256_set1_ps(ds[i * nb + b]), *o);
        }
    }
}

/* The forms whose block the tiles below serve: values below 32 as unsigned bytes, so that four
   maddubs of a half add in int16 (4 * 2 * 31 * 127 < 32767), all eight for the 4-bit ones. */
#define TILE_FORM(f) ((f) == 0 || (f) == 1 || (f) == 3 || (f) == 4 || (f) == 5 || (f) == 8)
/* R (1 or 2) activation rows against one (group, block) whose 16 weight vectors wv[half][t] were
   unpacked once for all the rows: every broadcast serves both halves, every weight vector both
   rows, and the sums stay in registers. Why: the per-row loop above keeps a half's 8 weight
   vectors, its sums and the scales live at once, more than AVX2's 16 registers, so gcc reloaded
   the weights for every row and the loop ran bound by the load ports (llvm-mca, Zen 3: 10.5
   cycles per row and half, ~40 instructions). The same integer sums and the same float operations
   in the same order as r16_block_avx2: the same floats, whatever the row's neighbours. */
static inline void r16_tile_avx2(const __m256i (*wv)[8], const __m256 *dv, const __m256 *mv, int four,
                                 const int8_t *a, int64_t K, int R, const float *da, const float *ds, int64_t nb,
                                 __m256 *acc) {
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i s16[2][2], s32[2][2];
    for (int r = 0; r < R; r++) for (int h = 0; h < 2; h++) s16[r][h] = s32[r][h] = _mm256_setzero_si256();
    for (int t = 0; t < 8; t++) {
        __m256i bx[2];
        for (int r = 0; r < R; r++) bx[r] = _mm256_set1_epi32(((const int32_t *)(a + r * K))[t]);
        for (int h = 0; h < 2; h++) {
            const __m256i w = _mm256_load_si256(&wv[h][t]);
            for (int r = 0; r < R; r++) {
                s16[r][h] = _mm256_add_epi16(s16[r][h], _mm256_maddubs_epi16(w, bx[r]));
                __asm__("" : "+x"(s16[r][h]));   /* keeps gcc from computing all 32 products first (spilled) and adding them after */
            }
        }
        if (!four && t == 3)   /* 5-bit values: the first four products of each half to int32 */
            for (int r = 0; r < R; r++) for (int h = 0; h < 2; h++) {
                s32[r][h] = _mm256_madd_epi16(s16[r][h], ones); s16[r][h] = _mm256_setzero_si256();
            }
    }
    for (int r = 0; r < R; r++) {
        const __m256 dar = _mm256_set1_ps(da[r * nb]), dsr = _mm256_set1_ps(ds[r * nb]);
        for (int h = 0; h < 2; h++) {
            __m256i s = _mm256_madd_epi16(s16[r][h], ones);
            if (!four) s = _mm256_add_epi32(s32[r][h], s);
            __m256 o = _mm256_load_ps((const float *)(acc + 2 * r + h));   /* one load and one store (acc may alias da) */
            o = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_mul_ps(dv[h], dar), o);
            acc[2 * r + h] = _mm256_fmadd_ps(mv[h], dsr, o);
        }
    }
}
/* Q8_0's form 6 as the tiles above (r16_block_avx2's sign trick: |w| times x * sign(w)): one
   product of 128 * 127 pairs fills int16, so each goes to int32 at once. */
static inline void r16_tile_q8_avx2(const __m256i (*wv)[8], const __m256i (*aw)[8], const __m256 *dv, const int8_t *a,
                                    int64_t K, int R, const float *da, int64_t nb, __m256 *acc) {
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i s32[2][2];
    for (int r = 0; r < R; r++) for (int h = 0; h < 2; h++) s32[r][h] = _mm256_setzero_si256();
    for (int t = 0; t < 8; t++) {
        __m256i bx[2];
        for (int r = 0; r < R; r++) bx[r] = _mm256_set1_epi32(((const int32_t *)(a + r * K))[t]);
        for (int h = 0; h < 2; h++) {
            const __m256i w = _mm256_load_si256(&wv[h][t]), m = _mm256_load_si256(&aw[h][t]);
            for (int r = 0; r < R; r++) {
                s32[r][h] = _mm256_add_epi32(s32[r][h], _mm256_madd_epi16(_mm256_maddubs_epi16(m, _mm256_sign_epi8(bx[r], w)), ones));
                __asm__("" : "+x"(s32[r][h]));
            }
        }
    }
    for (int r = 0; r < R; r++) {
        const __m256 dar = _mm256_set1_ps(da[r * nb]);
        for (int h = 0; h < 2; h++) {
            const __m256 o = _mm256_load_ps((const float *)(acc + 2 * r + h));
            acc[2 * r + h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s32[r][h]), _mm256_mul_ps(dv[h], dar), o);
        }
    }
}
static inline void r16_block_q8_tiles_avx2(const uint8_t *u, const void *sc, const int8_t *a, int64_t K, const float *da,
                                           int64_t nb, int64_t b, int mc, __m256 *acc) {
    __m256i wv[2][8], aw[2][8];
    __m256 dv[2];
    for (int h = 0; h < 2; h++) r16_half_q8_avx2(u, sc, h, wv[h], aw[h], &dv[h]);
    const __m256i (*w)[8] = (const __m256i (*)[8])wv, (*m)[8] = (const __m256i (*)[8])aw;
    int i = 0;
    for (; i + 2 <= mc; i += 2) r16_tile_q8_avx2(w, m, dv, a + i * K + 32 * b, K, 2, da + i * nb + b, nb, acc + 2 * i);
    if (i < mc) r16_tile_q8_avx2(w, m, dv, a + i * K + 32 * b, K, 1, da + i * nb + b, nb, acc + 2 * i);
}
/* mc (2..PASS_ROWS) rows against one (group, block) of a TILE_FORM: its values unpacked once into
   bytes, then the rows two at a time. */
static inline void r16_block_tiles_avx2(int form, const uint8_t *u, const void *sc, const int8_t *a, int64_t K,
                                        const float *da, const float *ds, int64_t nb, int64_t b, int mc,
                                        __m256 *acc) {
    __m256i wv[2][8];
    __m256 dv[2], mv[2];
    for (int h = 0; h < 2; h++) r16_half_avx2(form, u, sc, h, wv[h], &dv[h], &mv[h]);
    const __m256i (*w)[8] = (const __m256i (*)[8])wv;
    const int four = form == 1 || form == 4;
    int i = 0;
    if (four)   /* a constant argument: each call is its own unrolled copy */
        for (; i + 2 <= mc; i += 2) r16_tile_avx2(w, dv, mv, 1, a + i * K + 32 * b, K, 2, da + i * nb + b, ds + i * nb + b, nb, acc + 2 * i);
    else
        for (; i + 2 <= mc; i += 2) r16_tile_avx2(w, dv, mv, 0, a + i * K + 32 * b, K, 2, da + i * nb + b, ds + i * nb + b, nb, acc + 2 * i);
    if (i < mc)
        r16_tile_avx2(w, dv, mv, four, a + i * K + 32 * b, K, 1, da + i * nb + b, ds + i * nb + b, nb, acc + 2 * i);
}
#endif

/* Bytes per (16-row group, 32-block) of `form`: its values (U), or its scales (D) with `scales`. */
int qform_bytes(int form, int scales) { return scales ? FORM_DB(form) : FORM_UB(form); }

/* Whether qmatmul_r16 has a vector form for `type` in `form` here (else the per-row dots are
   faster); forms at FORM_NIB above. AVX2 runs Q8_0 in form 6 only (form 0's shifted bytes would
   saturate maddubs). */
int qmatmul_r16_serves(int type, int form) {
#if defined(QM_VNNI512) || defined(__AVX2__)
#if defined(QM_VNNI512) || defined(__F16C__)
    if (form == 1) return type == Q4_0 || type == Q4_1;
    if (form == 3) return type == Q5_0 || type == Q5_1;
    if (form == 6) return type == Q8_0;   /* AVX2: signed bytes through maddubs' sign trick */
#endif
    if (form == 2) return type == Q6_K;
    if (form == 4) return type == Q4_K;
    if (form == 5) return type == Q5_K || type == MXFP4;   /* MXFP4's u = kvalue + 12 fits 5 bits */
    if (form == 8) return type == MXFP4;
#if defined(QM_VNNI512)
    if (form == 7) return type == Q6_K;
    if (form == 0) return type == Q4_0 || type == Q4_1 || type == Q5_0 || type == Q5_1 || type == Q8_0 || type == Q4_K || type == Q5_K
                           || type == MXFP4;
#else
    if (form == 0) return type == Q4_0 || type == Q4_1 || type == Q5_0 || type == Q5_1 || type == Q4_K || type == Q5_K
                           || type == MXFP4;
#endif
#endif
    (void)type; (void)form;
    return 0;
}

/* The fused prologue: row m of the matmul's input into xf [K] float32. glu: x's row is gate|up
   [2K] and the input is silu(gate) * up (the silu_mul kernel's formula); gw: then RMS-normed with
   weight gw (the rms_norm kernel's formula and summation order: the same floats as the two kernels
   called apart). */
static void prologue_row(const void *x, int64_t off, int xb, int64_t K, const void *gw, int gwb, float eps,
                         int glu, float *xf) {
    if (glu) {
        int64_t i = 0;
#ifdef SLOT_AVX512
        for (; i + 16 <= K; i += 16) _mm512_storeu_ps(xf + i, silu_mul16(load16(x, off + i, xb), load16(x, off + K + i, xb)));
#elif defined(SLOT_AVX2)
        for (; i + 8 <= K; i += 8) _mm256_storeu_ps(xf + i, silu_mul8(load8(x, off + i, xb), load8(x, off + K + i, xb)));
#endif
        for (; i < K; i++) xf[i] = silu_mul1(ld(x, off + i, xb), ld(x, off + K + i, xb));
    } else load_row(x, off, xb, K, xf);
    if (gw) rms_apply(xf, rms_inv(xf, K, eps), gw, gwb, K, xf);
}

/* prologue_row for M rows into out [M, K] float32: the fused input for the paths that do not fuse. */
int qprologue(const void *x, float *out, const void *gw, int64_t M, int64_t K, int64_t sx, float eps, int xb, int gwb,
              int glu, int n_threads) {
    #pragma omp parallel for num_threads(n_threads) if (M >= 2 && M * K >= PROLOGUE_PARALLEL)
    for (int64_t m = 0; m < M; m++) prologue_row(x, m * sx, xb, K, gw, gwb, eps, glu, out + m * K);
    return 0;
}

/* y[m, n] = sum_k x[m, k] W[n, k] on repacked weights; x/y rows sx/sy elements apart. form 1: U is
   the 4-bit form with float16 scales (D = S); 0 and 2: bytes with float scales (D). Fused: x
   through prologue_row (gw: an RMSNorm weight or NULL; glu), and accum: y += the product (a residual). */
/* out [mc][os] (nc columns) into y's rows m0.., columns n0.. below N: stored, or added (accum). */
static void r16_store(void *y, int yb, int64_t sy, int accum, int64_t N, int64_t m0, int mc, int64_t n0, int nc,
                      const float *out, int64_t os) {
#if defined(QM_VNNI512)
    if (!yb && n0 + nc <= N) {   /* whole vectors of float32 (element by element: Q5_0 896 x 4864, 128 rows,
                                    one thread, 631 against 719 GFLOP/s) */
        for (int i = 0; i < mc; i++)
            for (int r = 0; r < nc; r += 16) {
                float *yo = (float *)y + (m0 + i) * sy + n0 + r;
                const __m512 v = _mm512_loadu_ps(out + i * os + r);
                _mm512_storeu_ps(yo, accum ? _mm512_add_ps(_mm512_loadu_ps(yo), v) : v);
            }
        return;
    }
#endif
    for (int i = 0; i < mc; i++)
        for (int r = 0; r < nc && n0 + r < N; r++) {
            const int64_t o = (m0 + i) * sy + n0 + r;
            st(y, o, yb, accum ? ld(y, o, yb) + out[i * os + r] : out[i * os + r]);
        }
}

#if defined(QM_VNNI512)
/* Where row m's block b goes when the activations are laid out for the tiles (t512_rows): rows in
   tiles of T512_ROWS from row 0, each tile's blocks interleaved by row, [nb][R][32] bytes and
   [nb][R] scales. In units of blocks (x 32 for the bytes). */
static inline int64_t t512_at(int64_t m, int64_t M, int64_t nb, int64_t b) {
    const int64_t m0 = m - m % T512_ROWS, R = M - m0 < T512_ROWS ? M - m0 : T512_ROWS;
    return m0 * nb + b * R + (m - m0);
}

/* qmatmul_r16 from T512_MIN_ROWS rows (see t512_tile): pairs of groups over the threads, each with
   its own unpacked buffer. -> 1 when out of memory. */
static int r16_tiles_512(const uint8_t *U, const uint8_t *D, const int8_t *q, const float *da, const float *ds,
                         const int32_t *xo, void *y, int64_t M, int64_t N, int64_t K, int64_t sy, int yb, int accum, int form, int n_threads) {
    const int64_t nb = K / 32, ng = (N + 15) / 16, ub = FORM_UB(form), db = FORM_DB(form);
    int failed = 0;
    #pragma omp parallel num_threads(n_threads) if (ng * K * M >= 8192)
    {
        uint8_t *W = aligned_alloc(64, nb * 2 * 512);
        float *S = aligned_alloc(64, nb * 2 * 32 * sizeof(float));
        if (!W || !S) {
            #pragma omp atomic write
            failed = 1;
        }
        #pragma omp for schedule(guided)
        for (int64_t p = 0; p < (ng + 1) / 2; p++) {
            if (!W || !S) continue;
            const int64_t g0 = 2 * p;
            const int G = ng - g0 >= 2 ? 2 : 1;
            t512_unpack(form, U, D, ub, db, nb, g0, G, W, S);
            /* each of the T row tiles prefetches a T-th of the next pair (pub / pdb bytes a block) */
            const int64_t T = (M + T512_ROWS - 1) / T512_ROWS;
            const int64_t pub = ((2 * ub + T - 1) / T + 63) & ~(int64_t)63, pdb = ((2 * db + T - 1) / T + 63) & ~(int64_t)63;
            const int pf = g0 + 2 < ng;
            for (int64_t m0 = 0; m0 < M; m0 += T512_ROWS) {
                const int mc = M - m0 < T512_ROWS ? (int)(M - m0) : T512_ROWS;
                const int64_t tile = m0 / T512_ROWS;
                float out[T512_ROWS][32];
                t512_rows(W, S, nb, G, q + m0 * K, da + m0 * nb, ds + m0 * nb, xo ? xo + m0 * nb : NULL, mc, out,
                          pf ? U + (g0 + 2) * nb * ub + tile * nb * pub : NULL, pub,
                          pf ? D + (g0 + 2) * nb * db + tile * nb * pdb : NULL, pdb);
                r16_store(y, yb, sy, accum, N, m0, mc, g0 * 16, 16 * G, &out[0][0], 32);
            }
        }
        free(W); free(S);
    }
    return failed;
}
#endif

int qmatmul_r16(const uint8_t *U, const void *D, const void *x, void *y, const void *gw, int64_t M, int64_t N,
                int64_t K, int64_t sx, int64_t sy, float eps, int xb, int yb, int gwb, int glu, int accum, int form,
                int off, int n_threads) {
    const int64_t db = FORM_DB(form);
    const int64_t nb = K / 32, ng = (N + 15) / 16, ub = FORM_UB(form);
    int8_t *q = malloc(M * K + 64); float *da = malloc(M * nb * sizeof(float) + 64), *ds = malloc(M * nb * sizeof(float) + 64);
    int16_t *as = malloc(M * (K / 16) * sizeof(int16_t) + 64);
#if !defined(QM_VNNI512)
    off = 0;   /* the AVX2 and portable loops add the min with its FMA */
#endif
    int32_t *xo = off ? malloc(M * nb * sizeof(int32_t) + 64) : NULL;   /* -off * each block's activation sum */
    const float *sc = (const float *)D;
    if (!q || !da || !ds || !as || (off && !xo)) { free(q); free(da); free(ds); free(as); free(xo); return 1; }
#if defined(QM_VNNI512)
    /* Q6_K's forms (a scale per 16) stay on the 16-row loop: tiles of 3 rows with both halves' sums,
       or 6 rows with a half at a time, were no faster */
    const int tiled = M >= T512_MIN_ROWS && form != 2 && form != 7;
#else
    const int tiled = 0;
#endif
    const size_t xbytes = K * sizeof(float) + (tiled ? K + nb * sizeof(float) : 0);
    #pragma omp parallel for num_threads(n_threads) if (M >= 2 && M * K >= PROLOGUE_PARALLEL)
    for (int64_t m = 0; m < M; m++) {
        float on_stack[xbytes <= ROW_STACK_BYTES ? xbytes / sizeof(float) + 1 : 1];
        float *xf = xbytes <= ROW_STACK_BYTES ? on_stack : malloc(xbytes);
        prologue_row(x, m * sx, xb, K, gw, gwb, eps, glu, xf);
        int8_t *qm = tiled ? (int8_t *)(xf + K) : q + m * K;   /* tiled: the row here, then its blocks to their places */
        float *dm = tiled ? (float *)(qm + K) : da + m * nb;
        quantize_row(xf, K, 32, qm, dm, as + m * (K / 16));
        for (int64_t b = 0; b < nb; b++) {
            const int sum = as[m * (K / 16) + 2 * b] + as[m * (K / 16) + 2 * b + 1];
#if defined(QM_VNNI512)
            const int64_t o = tiled ? t512_at(m, M, nb, b) : m * nb + b;
            if (tiled) memcpy(q + 32 * o, qm + 32 * b, 32);
#else
            const int64_t o = m * nb + b;
#endif
            da[o] = dm[b];
            ds[o] = dm[b] * (float)sum;
            if (xo) xo[o] = -off * sum;
        }
        if (xf != on_stack) free(xf);
    }
#if defined(QM_VNNI512)
    if (tiled) {   /* xo: the offset folded into the integer sums (see R16_OFFSET), or NULL */
        const int rc = r16_tiles_512(U, (const uint8_t *)D, q, da, ds, xo, y, M, N, K, sy, yb, accum, form, n_threads);
        free(q); free(da); free(ds); free(as); free(xo);
        return rc;
    }
#endif
    /* guided: contiguous chunks (the prefetch above runs on into the next group), shrinking at the
       end so that a thread slowed by another process (the server's event loop on 2 cores) does
       not leave the other spinning at the barrier; static's halves were 1-7% slower even alone */
    #pragma omp parallel for num_threads(n_threads) schedule(guided) if (ng * K * M >= 8192)
    for (int64_t g = 0; g < ng; g++) {
        for (int64_t m0 = 0; m0 < M; m0 += PASS_ROWS) {
            const int mc = M - m0 < PASS_ROWS ? (int)(M - m0) : PASS_ROWS;
            float out[PASS_ROWS][16];
            const int8_t *a = q + m0 * K; const float *dam = da + m0 * nb, *dsm = ds + m0 * nb;
            const int16_t *asm_ = as + m0 * (K / 16);
#if defined(QM_VNNI512)
            __m512 acc[R16_ROWS];
            for (int i = 0; i < R16_ROWS; i++) acc[i] = _mm512_setzero_ps();
            for (int64_t b = 0; b < nb; b++) {
                const int64_t o = g * nb + b;
                const void *so = (const uint8_t *)D + db * o;
                if (m0 == 0) r16_prefetch(U + o * ub, ub, (const uint8_t *)so, db);
                const int32_t *xom = xo ? xo + m0 * nb : NULL;
                if (mc == R16_ROWS) r16_block_512(form, U + o * ub, so, a, K, dam, dsm, xom, asm_, nb, b, R16_ROWS, acc);
                else if (mc == 1) r16_block_512(form, U + o * ub, so, a, K, dam, dsm, xom, asm_, nb, b, 1, acc);
                else r16_block_512(form, U + o * ub, so, a, K, dam, dsm, xom, asm_, nb, b, mc, acc);
            }
            for (int i = 0; i < mc; i++) _mm512_storeu_ps(out[i], acc[i]);
#elif defined(__AVX2__)
            __m256 acc[2 * PASS_ROWS];
            for (int i = 0; i < 2 * mc; i++) acc[i] = _mm256_setzero_ps();   /* the pass's rows only: zeroing all
                2 * PASS_ROWS per group cost 6-13% of a one-row call (Zen 3: Q8_0 262144 x 640, Q4_1 49152 x 576) */
            for (int64_t b = 0; b < nb; b++) {
                const int64_t o = g * nb + b;
                const void *so = (const uint8_t *)D + db * o;
                if (m0 == 0) r16_prefetch(U + o * ub, ub, (const uint8_t *)so, db);
                if (mc >= 2 && TILE_FORM(form)) r16_block_tiles_avx2(form, U + o * ub, so, a, K, dam, dsm, nb, b, mc, acc);
                else if (mc >= 2 && form == 6) r16_block_q8_tiles_avx2(U + o * ub, so, a, K, dam, nb, b, mc, acc);
                else if (mc == 1) r16_block_avx2(form, U + o * ub, so, a, K, dam, dsm, asm_, nb, b, 1, acc);
                else r16_block_avx2(form, U + o * ub, so, a, K, dam, dsm, asm_, nb, b, mc, acc);
            }
            for (int i = 0; i < mc; i++) { _mm256_storeu_ps(out[i], acc[2 * i]); _mm256_storeu_ps(out[i] + 8, acc[2 * i + 1]); }
#else
            for (int i = 0; i < mc; i++) for (int r = 0; r < 16; r++) out[i][r] = 0.0f;   /* byte form only (serves) */
            for (int64_t b = 0; b < nb; b++) {
                const int64_t o = g * nb + b;
                const uint8_t *u = U + o * 512;
                for (int i = 0; i < mc; i++) {
                    const int8_t *ai = a + i * K + 32 * b;
                    for (int r = 0; r < 16; r++) {
                        int s = 0;
                        for (int t = 0; t < 8; t++) for (int j = 0; j < 4; j++) s += (int)u[t * 64 + r * 4 + j] * (int)ai[4 * t + j];
                        out[i][r] += sc[32 * o + r] * dam[i * nb + b] * (float)s + sc[32 * o + 16 + r] * dsm[i * nb + b];
                    }
                }
            }
#endif
            r16_store(y, yb, sy, accum, N, m0, mc, g * 16, 16, &out[0][0], 16);
        }
    }
    free(q); free(da); free(ds); free(as); free(xo);
    return 0;
}

/* One unpacked row as floats (loops per block / per 16 so that they vectorize). */
static void row_floats(int type, Row r, int64_t K, float *f) {
    if (is_k(type)) {
        for (int64_t j = 0; j < K / 16; j++) {
            const float s = r.d[j >> 4] * (float)r.sc[j], m = r.dm[j >> 4] * (float)r.mn[j];
            for (int i = 0; i < 16; i++) f[16 * j + i] = s * (float)r.u[16 * j + i] - m;
        }
    } else if (type == Q8_0) {
        for (int64_t b = 0; b < K / 32; b++)
            for (int i = 0; i < 32; i++) f[32 * b + i] = r.d[b] * (float)(int8_t)r.u[32 * b + i];
    } else if (type == MXFP4) {   /* kvalue * d, ggml's product (d*u + m would round, or inf - inf at e = 255) */
        for (int64_t b = 0; b < K / 32; b++)
            for (int i = 0; i < 32; i++) f[32 * b + i] = (float)((int)r.u[32 * b + i] - 12) * r.d[b];
    } else {
        for (int64_t b = 0; b < K / 32; b++)
            for (int i = 0; i < 32; i++) f[32 * b + i] = r.d[b] * (float)r.u[32 * b + i] + r.dm[b];
    }
}

/* Rows [n0, n1) of W as float32/bf16 (ob) into out[(n - n0) * K + k]. */
int qdequant(const void *w, void *out, int64_t n0, int64_t n1, int64_t K, int64_t sw, int64_t bs, int type,
             int ob, int n_threads) {
    #pragma omp parallel num_threads(n_threads) if ((n1 - n0) * K >= 65536)
    {
        Row r = row_alloc(K);
        float *f = malloc(K * sizeof(float));
        #pragma omp for schedule(static)
        for (int64_t n = n0; n < n1; n++) {
            unpack_row(type, (const uint8_t *)w + n * sw, K, bs, r);
            const int64_t o = (n - n0) * K;
            row_floats(type, r, K, ob ? f : (float *)out + o);
            if (!ob) continue;
            int64_t e = 0;
#if defined(SLOT_AVX512)
            for (; e + 16 <= K; e += 16) store16(out, o + e, 1, _mm512_loadu_ps(f + e));
#endif
            for (; e < K; e++) ((uint16_t *)out)[o + e] = f2bf(f[e]);
        }
        free(f);
        row_free(r);
    }
    return 0;
}
