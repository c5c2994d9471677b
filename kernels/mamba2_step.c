/* mamba2_step.c: the CPU kernel of kernels/mamba2_step.py (compiled with native.PRELUDE in front:
   ld, st, fast_exp).

   A forward step's rows through a Mamba-2 layer (llama.cpp's build_mamba2_layer), between its two
   matmuls: proj [T, P] (row stride sp; float32, or bf16 with pb) = z [D] | xBC [C] | dt [H], with
   D = H hd (the heads' inputs x), C = D + 2 G N (x | B | C before the convolution). Sequence b owns
   rows offsets[b] .. + lens[b] - 1, its tokens in order, and continues stream streams[b]: its conv
   state conv[s] [w = d_conv - 1, C] (oldest first) and its state ssm[s] [H, N, hd], float32, in place.

   1. per sequence and channel block, its rows in order: causal_conv.c's convolution (with the bias)
      and SiLU -> xc [T, C];
   2. per sequence and head h (group g = h / (H / G)), its rows in order, with dt = softplus(dt_h +
      dt_bias[h]) and e = exp(dt a[h]):  S[n][:] = e S[n][:] + (B[g][n] dt) x_h[:],
      y = sum_n C[g][n] S[n][:] + d[h] x_h, times silu(z_h) -> ys [T, D] (the head's N x hd floats
      in cache across the tokens; one pass a token);
   3. per row and group: y RMS-normed over its D / G values, times norm (NULL: no norm) -> out [T, D] (row stride so;
      float32, or bf16 with ob).
   Every (sequence, head) alone, token by token in a fixed order: a row's floats depend neither on
   the batch nor on how a prompt was cut into steps. */
#include <stdlib.h>

#define MAX_HD 512
/* 2: one (sequence, head) over its rows */
static void scan_head(const void *proj, const float *xc, float *ssm, int64_t s, const float *dt_bias, const float *a,
                      const float *d, float *ys, int64_t first, int64_t len, int64_t h, int64_t sp, int64_t H,
                      int64_t G, int64_t N, int64_t hd, int pb) {
    const int64_t D = H * hd, C = D + 2 * G * N, g = h / (H / G);
    float *S = ssm + (s * H + h) * N * hd;
    float y[MAX_HD], bx[MAX_HD];
    for (int64_t t = first; t < first + len; t++) {
        const float *x = xc + t * C + h * hd, *B = xc + t * C + D + g * N, *Cv = xc + t * C + D + G * N + g * N;
        const float z0 = ld(proj, t * sp + D + C + h, pb) + dt_bias[h];
        const float dt = z0 > 20.0f ? z0 : log1pf(expf(z0)), e = expf(dt * a[h]);
        for (int64_t p = 0; p < hd; p++) { y[p] = d[h] * x[p]; bx[p] = x[p] * dt; }
        for (int64_t n = 0; n < N; n++) {
            float *restrict row = S + n * hd;
            const float bn = B[n], cn = Cv[n];
            for (int64_t p = 0; p < hd; p++) {
                const float r = e * row[p] + bn * bx[p];
                row[p] = r;
                y[p] += cn * r;
            }
        }
        float *o = ys + t * D + h * hd;
        for (int64_t p = 0; p < hd; p++) {
            const float z = ld(proj, t * sp + h * hd + p, pb);
            o[p] = y[p] * (z * sigm(z));
        }
    }
}

int mamba2_step(const void *proj, float *conv, float *ssm, const int64_t *streams, const int64_t *offsets,
                const int64_t *lens, const float *taps, const float *bias, const float *dt_bias, const float *a,
                const float *d, const float *norm, void *out, int64_t B, int64_t T, int64_t sp, int64_t so, int64_t G,
                int64_t H, int64_t N, int64_t hd, int64_t d_conv, float eps, int pb, int ob, int n_threads) {
    if (hd > MAX_HD || G < 1 || H % G || d_conv < 1 || d_conv > 8) return 2;
    for (int64_t b = 0; b < B; b++)
        if (offsets[b] < 0 || lens[b] < 0 || offsets[b] + lens[b] > T) return 3;
    const int64_t D = H * hd, C = D + 2 * G * N, gs = D / G;
    const int64_t blocks = (C + CAUSAL_CONV_BLOCK - 1) / CAUSAL_CONV_BLOCK;
    float *xc = malloc((size_t)(T * C) * sizeof(float)), *ys = malloc((size_t)(T * D) * sizeof(float));
    if (!xc || !ys) { free(xc); free(ys); return 1; }
    #pragma omp parallel num_threads(n_threads) if (T * H > 1)
    {
        #pragma omp for schedule(dynamic, 1)
        for (int64_t i = 0; i < B * blocks; i++) {   /* a sequence's channel block, its rows in order */
            const int64_t b = i / blocks, c0 = (i % blocks) * CAUSAL_CONV_BLOCK;
            causal_conv_silu(proj, conv + streams[b] * (d_conv - 1) * C, taps, bias, xc, offsets[b], lens[b], sp, D,
                             C, d_conv, pb, c0, c0 + CAUSAL_CONV_BLOCK < C ? c0 + CAUSAL_CONV_BLOCK : C);
        }
        #pragma omp for schedule(dynamic, 1)
        for (int64_t i = 0; i < B * H; i++)   /* a sequence's head, its rows in order */
            scan_head(proj, xc, ssm, streams[i / H], dt_bias, a, d, ys, offsets[i / H], lens[i / H], i % H, sp, H, G,
                      N, hd, pb);
        #pragma omp for schedule(static)
        for (int64_t i = 0; i < T * G; i++) {   /* a row's group: RMS-normed (norm NULL: as it is) */
            const float *y = ys + (i / G) * D + (i % G) * gs;
            if (!norm) {
                for (int64_t k = 0; k < gs; k++) st(out, (i / G) * so + (i % G) * gs + k, ob, y[k]);
                continue;
            }
            float ss = 0.0f;
            for (int64_t k = 0; k < gs; k++) ss += y[k] * y[k];
            const float r = 1.0f / sqrtf(ss / (float)gs + eps);
            for (int64_t k = 0; k < gs; k++)
                st(out, (i / G) * so + (i % G) * gs + k, ob, y[k] * r * norm[(i % G) * gs + k]);
        }
    }
    free(xc);
    free(ys);
    return 0;
}
