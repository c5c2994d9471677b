/* gelu_mul.c: the CPU kernel of kernels/gelu_mul.py, compiled with native.PRELUDE
   (slotserver/runtime/prelude.h) in front.

   gelu(g) * u per element in float32, one rounding: g / (1 + exp(-2z)),
   z = sqrt(2/pi)(g + 0.044715 g^3). The AVX-512 path takes the reciprocal as rcp14 plus one
   Newton step (relative error ~1e-7), as silu_mul does. Rows split over the threads from 8K
   elements on. */
#define GELU_K 1.5957691216057308f   /* 2 sqrt(2/pi) */
static inline float gelu_mul1(float g, float u) {
    return g / (1.0f + fast_exp(-GELU_K * (g + 0.044715f * g * g * g))) * u;
}

#ifdef SLOT_AVX512
static inline __m512 gelu_mul16(__m512 g, __m512 u) {
    const __m512 g3 = _mm512_mul_ps(_mm512_mul_ps(g, g), g);
    const __m512 z = _mm512_mul_ps(_mm512_set1_ps(-GELU_K), _mm512_fmadd_ps(_mm512_set1_ps(0.044715f), g3, g));
    const __m512 den = _mm512_add_ps(_mm512_set1_ps(1.0f), fast_exp16(z));
    __m512 r = _mm512_rcp14_ps(den);
    r = _mm512_mul_ps(r, _mm512_fnmadd_ps(den, r, _mm512_set1_ps(2.0f)));     /* Newton: r (2 - den r) */
    return _mm512_mul_ps(_mm512_mul_ps(g, r), u);
}
#endif

int gelu_mul(const void *gu, void *out, int64_t T, int64_t F, int64_t sg, int b, int n_threads) {
    #pragma omp parallel for num_threads(n_threads) if (T * F >= 8192) schedule(static)
    for (int64_t t = 0; t < T; t++) {
        int64_t i = 0;
#ifdef SLOT_AVX512
        for (; i + 16 <= F; i += 16)
            store16(out, t * F + i, b, gelu_mul16(load16(gu, t * sg + i, b), load16(gu, t * sg + F + i, b)));
#endif
        if (b) for (; i < F; i++) st(out, t * F + i, 1, gelu_mul1(ld(gu, t * sg + i, 1), ld(gu, t * sg + F + i, 1)));
        else for (; i < F; i++) st(out, t * F + i, 0, gelu_mul1(ld(gu, t * sg + i, 0), ld(gu, t * sg + F + i, 0)));
    }
    return 0;
}
