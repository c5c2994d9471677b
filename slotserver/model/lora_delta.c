/* lora_delta.c: the LoRA delta of slotserver/model/lora_delta.py. Compiled with native.PRELUDE
   (slotserver/runtime/prelude.h) in front (bf2f, f2bf, ld, st, rms_inv, silu_mul1: the fused
   qmatmul's own norm and gate formulas).

   For rows t < T of x (x's row stride sx, K inputs; bf16 or float32), the matmul input h is
     mode 0: x itself;  mode 1: rms_norm(x) * w (eps);  mode 2: silu(x[:, :K]) * x[:, K:2K] (gate|up),
   and y's row t (stride sy, N outputs, bf16 or float32) gets, in place,
     y[t, n] += sum_r BT[r, n] * s_r * sum_k A[r, k] * h[k],   s_r = factor[r] * scales[t * S + adapter[r]]
   A [R, K], BT [R, N] (B transposed: each rank's outputs contiguous, so the second product is R
   contiguous multiply-adds over a block of outputs, not one short dot per output), factor [R]
   float32, adapter [R] int64, scales [T, S] float32. */
#include <stdlib.h>
#define BLOCK 256
int lora_delta(const void *x, const float *w, const float *a, const float *bt, const int64_t *adapter,
               const float *factor, const float *scales, void *y, int64_t T, int64_t K, int64_t R, int64_t N,
               int64_t S, int64_t sx, int64_t sy, int64_t mode, int64_t xb, int64_t yb, float eps, int n_threads) {
    float *u = malloc((size_t)(T * R) * sizeof(float));   /* [T, R]: (A h) scaled */
    float *h = malloc((size_t)(T * K) * sizeof(float));   /* [T, K]: the matmul's input rows */
    if (!u || !h) { free(u); free(h); return 1; }
    /* One parallel region, three shared loops: the weights (A, B) are the bytes that count, and both
       cores read them; a decode step makes ~4 of these calls a layer right after the matmul's own
       parallel region, so its threads are awake. */
    #pragma omp parallel num_threads(n_threads) if (R * (K + N) >= 8192)
    {
        #pragma omp for schedule(static)
        for (int64_t t = 0; t < T; t++) {
            const int64_t xo = t * sx;
            float *ht = h + t * K;
            if (mode == 2) {
                for (int64_t k = 0; k < K; k++) ht[k] = silu_mul1(ld(x, xo + k, (int)xb), ld(x, xo + K + k, (int)xb));
            } else {
                for (int64_t k = 0; k < K; k++) ht[k] = ld(x, xo + k, (int)xb);
                if (mode == 1) {
                    const float r = rms_inv(ht, K, eps);
                    for (int64_t k = 0; k < K; k++) ht[k] = ht[k] * r * w[k];
                }
            }
        }
        /* u = (h A^T) scaled: each of A's rows read once for every row of h */
        #pragma omp for schedule(static)
        for (int64_t r = 0; r < R; r++) {
            const float *ar = a + r * K;
            for (int64_t t = 0; t < T; t++) {
                const float *ht = h + t * K;
                float s = 0.0f;
                for (int64_t k = 0; k < K; k++) s += ar[k] * ht[k];
                u[t * R + r] = s * factor[r] * scales[t * S + adapter[r]];
            }
        }
        /* y += u BT, a block of outputs at a time: the block of BT stays in cache across the rows */
        #pragma omp for schedule(static)
        for (int64_t n0 = 0; n0 < N; n0 += BLOCK) {
            const int64_t nn = N - n0 < BLOCK ? N - n0 : BLOCK;
            for (int64_t t = 0; t < T; t++) {
                float acc[BLOCK] = {0};
                for (int64_t r = 0; r < R; r++) {
                    const float c = u[t * R + r], *br = bt + r * N + n0;
                    for (int64_t i = 0; i < nn; i++) acc[i] += c * br[i];
                }
                for (int64_t i = 0; i < nn; i++) st(y, t * sy + n0 + i, (int)yb, ld(y, t * sy + n0 + i, (int)yb) + acc[i]);
            }
        }
    }
    free(h);
    free(u);
    return 0;
}
