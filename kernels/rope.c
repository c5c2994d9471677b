/* rope.c: the CPU kernel of kernels/rope.py, compiled with native.PRELUDE
   (slotserver/runtime/prelude.h) in front.

   Pairs (2i, 2i+1) of the first 2R dims turn by (cos, sin)[t, i], the rest is copied; float32 math.
   Per token, cos and sin are laid out once as [c0 c0 c1 c1 ..] and [-s0 s0 -s1 s1 ..]; then a row
   is x * cos2 + swap_pairs(x) * sin2, 16 lanes at a time with AVX-512 (the pair loop does not
   vectorize by itself). Tokens split over the threads from 8K elements on. */
#include <stdlib.h>

int rope(const void *x, const void *cs, const void *sn, void *out, int64_t T, int64_t H, int64_t D, int64_t R,
         int64_t sxt, int64_t sxh, int64_t sct, int64_t sst, int xb, int cb, int n_threads) {
    int failed = 0;
    #pragma omp parallel for num_threads(n_threads) if (T * H * D >= 8192) schedule(static) reduction(|:failed)
    for (int64_t t = 0; t < T; t++) {
        float *c2 = malloc(sizeof(float) * 4 * R);             /* [cos2 | sin2], 2R each */
        if (!c2) { failed = 1; continue; }
        float *s2 = c2 + 2 * R;
        for (int64_t i = 0; i < R; i++) {
            const float c = ld(cs, t * sct + i, cb), s = ld(sn, t * sst + i, cb);
            c2[2 * i] = c2[2 * i + 1] = c;
            s2[2 * i] = -s; s2[2 * i + 1] = s;
        }
        for (int64_t h = 0; h < H; h++) {
            const int64_t in = t * sxt + h * sxh, o = (t * H + h) * D;
            int64_t d = 0;
#ifdef SLOT_AVX512
            for (; d + 16 <= 2 * R; d += 16) {
                const __m512 v = load16(x, in + d, xb);
                store16(out, o + d, xb, _mm512_fmadd_ps(v, _mm512_loadu_ps(c2 + d),
                                                        _mm512_mul_ps(_mm512_permute_ps(v, 0xB1), _mm512_loadu_ps(s2 + d))));
            }
#endif
            for (; d < 2 * R; d += 2) {
                const float x0 = ld(x, in + d, xb), x1 = ld(x, in + d + 1, xb);
                st(out, o + d, xb, x0 * c2[d] + x1 * s2[d]);
                st(out, o + d + 1, xb, x1 * c2[d + 1] + x0 * s2[d + 1]);
            }
            for (; d < D; d++) st(out, o + d, xb, ld(x, in + d, xb));
        }
        free(c2);
    }
    return failed ? -3 : 0;
}
