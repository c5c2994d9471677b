/* rms_norm.c: the CPU kernel of kernels/rms_norm.py, compiled with native.PRELUDE
   (slotserver/runtime/prelude.h) in front: rms_inv and rms_apply are there, shared with qmatmul's
   fused prologue.

   One pass per row (`slotserver.runtime.native`): the sum of squares and the scaled store, float32
   math. */
#include <stdlib.h>
/* Rows (t, h) of x at t * sx + h * sh, T x H of them, N values each, into out's rows ao apart
   (dtype ab): stored (out [T, H, N], ao = N, x's dtype), or with `accum` added into a residual,
   each normed value rounded to x's dtype first (as the unfused add sees it). */
#define CHUNK 256
int rms_norm(const void *x, const void *w, void *out, int64_t T, int64_t H, int64_t N, int64_t sx, int64_t sh,
             int64_t ao, float eps, int xb, int wb, int accum, int ab, int n_threads) {
    int failed = 0;
    #pragma omp parallel num_threads(n_threads) if (T * H * N >= 65536) reduction(|: failed)
    {
        float *row = xb ? malloc(N * sizeof(float)) : NULL;   /* a bf16 row in float32 */
        failed = xb && !row;
        #pragma omp for schedule(static)
        for (int64_t r0 = 0; r0 < T * H; r0++) {
            const int64_t xo = (r0 / H) * sx + (r0 % H) * sh;
            const float *v = (const float *)x + xo;
            if (xb) { if (!row) continue; load_row(x, xo, 1, N, row); v = row; }
            const float r = rms_inv(v, N, eps);   /* the native prelude's: qmatmul's fused norm is the same code */
            float o[CHUNK];
            for (int64_t i0 = 0; i0 < N; i0 += CHUNK) {
                const int64_t n = N - i0 < CHUNK ? N - i0 : CHUNK;
                rms_apply(v + i0, r, (const char *)w + i0 * (wb ? 2 : 4), wb, n, o);
                if (xb) for (int64_t i = 0; i < n; i++) o[i] = bf2f(f2bf(o[i]));   /* x's dtype, as stored unfused */
                const int64_t oo = r0 * ao + i0;
                if (accum) for (int64_t i = 0; i < n; i++) st(out, oo + i, ab, ld(out, oo + i, ab) + o[i]);
                else for (int64_t i = 0; i < n; i++) st(out, oo + i, ab, o[i]);
            }
        }
        free(row);
    }
    return failed;   /* 1: out of memory */
}
