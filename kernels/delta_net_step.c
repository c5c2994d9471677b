/* delta_net_step.c: the CPU kernel of kernels/delta_net_step.py (compiled with native.PRELUDE in
   front: ld, st).

   One token on each of B sequences through a gated delta-net layer, between its two matmuls:
   proj [B, P] (row stride sp; float32, or bf16 with pb) = mixed [C] | z [H dv] | beta [H] | alpha [H],
   C = 2 n_k dk + H dv. Row b continues stream streams[b]: its conv state conv[s] [w = d_conv - 1, C]
   (the last w inputs, oldest first) and its state ssm[s] [H, dk, dv], both float32, updated in place.

   1. per row and channel: y = sum_j window[j] taps[c, j] over window = (the w inputs, this one);
      the state shifts by one input; then SiLU -> xc [B, C] (scratch);
   2. per row and v head h (q/k head h % n_k): q, k L2-normed (x / sqrt(sum x^2 + eps)), q scaled
      by 1/sqrt(dk); with e = exp(softplus(alpha + dt_bias) a) and b = sigmoid(beta):
        S = e S + k delta^T, delta = b (v - e S^T k);  o = S^T q = e (S^T q) + (k.q) delta
      so that one pass reads S (both products) and a second decays and updates it, both over the
      head's dk x dv floats while they are in cache; then o RMS-normed over dv, times norm and
      silu(z) -> out [B, H dv] (row stride so; float32, or bf16 with ob).
   Every (row, head) is computed alone, in a fixed order: a row's floats do not depend on the batch. */
#include <stdlib.h>

#define MAX_D 512

static inline float sigm(float x) { return 1.0f / (1.0f + expf(-x)); }

/* 1: channels [c0, c1) of row b. */
static void conv_rows(const void *proj, float *conv, const float *taps, float *xc, int64_t b, int64_t s,
                      int64_t sp, int64_t C, int64_t d_conv, int pb, int64_t c0, int64_t c1) {
    const int64_t w = d_conv - 1;
    float *st = conv + s * w * C;
    for (int64_t c = c0; c < c1; c++) {
        const float x = ld(proj, b * sp + c, pb);
        const float *t = taps + c * d_conv;
        float y = 0.0f;
        for (int64_t j = 0; j < w; j++) y += st[j * C + c] * t[j];
        y += x * t[w];
        for (int64_t j = 0; j + 1 < w; j++) st[j * C + c] = st[(j + 1) * C + c];
        if (w > 0) st[(w - 1) * C + c] = x;
        xc[b * C + c] = y * sigm(y);
    }
}

static float l2_inv(const float *x, int64_t n, float eps) {
    float ss = 0.0f;
    for (int64_t i = 0; i < n; i++) ss += x[i] * x[i];
    return 1.0f / sqrtf(ss + eps);
}

/* 2: row b, v head h. */
static void head(const void *proj, const float *xc, float *ssm, int64_t s, const float *dt_bias, const float *a,
                 const float *norm, void *out, int64_t b, int64_t h, int64_t sp, int64_t so, int64_t n_k,
                 int64_t H, int64_t dk, int64_t dv, float eps, int pb, int ob) {
    const int64_t key = n_k * dk, C = 2 * key + H * dv, kh = h % n_k;
    const float *x = xc + b * C, *q0 = x + kh * dk, *k0 = x + key + kh * dk, *v = x + 2 * key + h * dv;
    float q[MAX_D], k[MAX_D], ks[MAX_D], qs[MAX_D], delta[MAX_D], o[MAX_D];
    const float rq = l2_inv(q0, dk, eps), rk = l2_inv(k0, dk, eps), scale = 1.0f / sqrtf((float)dk);
    float kq = 0.0f;
    for (int64_t i = 0; i < dk; i++) {
        q[i] = q0[i] * rq * scale;
        k[i] = k0[i] * rk;
        kq += k[i] * q[i];
    }
    const int64_t p = b * sp + C + H * dv;
    const float beta = sigm(ld(proj, p + h, pb)), z0 = ld(proj, p + H + h, pb) + dt_bias[h];
    const float decay = expf((z0 > 20.0f ? z0 : log1pf(expf(z0))) * a[h]);
    float *S = ssm + (s * H + h) * dk * dv;
    for (int64_t j = 0; j < dv; j++) ks[j] = qs[j] = 0.0f;
    for (int64_t i = 0; i < dk; i++) {
        const float *restrict row = S + i * dv;
        const float ki = k[i], qi = q[i];
        for (int64_t j = 0; j < dv; j++) { ks[j] += ki * row[j]; qs[j] += qi * row[j]; }
    }
    float ss = 0.0f;
    for (int64_t j = 0; j < dv; j++) {
        delta[j] = beta * (v[j] - decay * ks[j]);
        o[j] = decay * qs[j] + kq * delta[j];
        ss += o[j] * o[j];
    }
    for (int64_t i = 0; i < dk; i++) {
        float *restrict row = S + i * dv;
        const float ki = k[i];
        for (int64_t j = 0; j < dv; j++) row[j] = decay * row[j] + ki * delta[j];
    }
    const float r = 1.0f / sqrtf(ss / (float)dv + eps);
    for (int64_t j = 0; j < dv; j++) {
        const float z = ld(proj, b * sp + C + h * dv + j, pb);
        st(out, b * so + h * dv + j, ob, o[j] * r * norm[j] * (z * sigm(z)));
    }
}

#define CONV_BLOCK 512
int delta_net_step(const void *proj, float *conv, float *ssm, const int64_t *streams, const float *taps,
                   const float *dt_bias, const float *a, const float *norm, void *out, int64_t B, int64_t sp,
                   int64_t so, int64_t n_k, int64_t H, int64_t dk, int64_t dv, int64_t d_conv, float eps, int pb,
                   int ob, int n_threads) {
    if (dk > MAX_D || dv > MAX_D || n_k < 1 || H % n_k) return 2;
    const int64_t C = 2 * n_k * dk + H * dv, blocks = (C + CONV_BLOCK - 1) / CONV_BLOCK;
    float *xc = malloc((size_t)(B * C) * sizeof(float));
    if (!xc) return 1;
    #pragma omp parallel num_threads(n_threads) if (B * H > 1)
    {
        #pragma omp for schedule(static)
        for (int64_t i = 0; i < B * blocks; i++) {
            const int64_t b = i / blocks, c0 = (i % blocks) * CONV_BLOCK;
            conv_rows(proj, conv, taps, xc, b, streams[b], sp, C, d_conv, pb, c0,
                      c0 + CONV_BLOCK < C ? c0 + CONV_BLOCK : C);
        }
        #pragma omp for schedule(static)
        for (int64_t i = 0; i < B * H; i++)
            head(proj, xc, ssm, streams[i / H], dt_bias, a, norm, out, i / H, i % H, sp, so, n_k, H, dk, dv, eps,
                 pb, ob);
    }
    free(xc);
    return 0;
}
