/* delta_net_step.c: the CPU kernel of kernels/delta_net_step.py (compiled with native.PRELUDE in
   front: ld, st).

   A forward step's rows through a gated delta-net layer, between its two matmuls: proj [T, P] (row
   stride sp; float32, or bf16 with pb) = mixed [C] | z [H dv] | beta [H] | alpha [H], C = 2 n_k dk +
   H dv. Sequence b owns rows offsets[b] .. + lens[b] - 1, its tokens in order, and continues stream
   streams[b]: its conv state conv[s] [w = d_conv - 1, C] (the last w inputs, oldest first) and its
   state ssm[s] [H, dk, dv], both float32, updated in place.

   1. per sequence and channel block, its rows in order: causal_conv.c's convolution and SiLU -> xc
      [T, C] (scratch);
   2. per sequence and v head h (q/k head h % n_k), its rows in order: q, k L2-normed (x / sqrt(sum
      x^2 + eps)), q scaled by 1/sqrt(dk); with e = exp(softplus(alpha + dt_bias) a), b = sigmoid(beta):
        S = e S + k delta^T, delta = b (v - e S^T k);  o = S^T q = e (S^T q) + (k.q) delta
      each token's update pass also sums the next token's two products (`scan_head`), so a
      prompt reads and writes each head's dk x dv floats once a token, in cache across its
      tokens; then o RMS-normed over dv, times norm and silu(z) -> out [T, H dv] (row stride so;
      float32, or bf16 with ob).
   Every (sequence, head) is computed alone, token by token in a fixed order: a row's floats depend
   neither on the batch nor on how a prompt was cut into steps. */
#include <stdlib.h>

#define MAX_D 512

static float l2_inv(const float *x, int64_t n, float eps) {
    float ss = 0.0f;
    for (int64_t i = 0; i < n; i++) ss += x[i] * x[i];
    return 1.0f / sqrtf(ss + eps);
}

/* 2: one (sequence, v head): its tokens in order over the head's state S [dk, dv] (row i: S[i][:]).
   Per token t: ks = S^T k_t and qs = S^T q_t (the state before it), delta = b (v - e ks),
   o = e qs + (k.q) delta, then S = e S + k_t delta^T. The update pass of token t also sums the
   next token's products over the rows it has just written (its k and q do not depend on the
   state), so a prompt reads and writes the state once a token; the first token has a read pass of
   its own. Columns in blocks of JB whose sums stay in registers (a block's rows are JB apart). */
#define JB 32

typedef struct { float q[MAX_D], k[MAX_D], kq, beta, decay; } Token;

/* token t's normed q (scaled) and k of q/k head kh, k.q, its write strength and decay for head h */
static void prepare(Token *tk, const void *proj, const float *xc, int64_t t, int64_t h, int64_t kh, int64_t sp,
                    int64_t C, int64_t key, int64_t H, int64_t dv, int64_t dk, const float *dt_bias, const float *a,
                    float eps, int pb) {
    const float *q0 = xc + t * C + kh * dk, *k0 = xc + t * C + key + kh * dk;
    const float rq = l2_inv(q0, dk, eps) / sqrtf((float)dk), rk = l2_inv(k0, dk, eps);
    tk->kq = 0.0f;
    for (int64_t i = 0; i < dk; i++) {
        tk->q[i] = q0[i] * rq;
        tk->k[i] = k0[i] * rk;
        tk->kq += tk->k[i] * tk->q[i];
    }
    const int64_t p = t * sp + C + H * dv;
    const float z0 = ld(proj, p + H + h, pb) + dt_bias[h];
    tk->beta = sigm(ld(proj, p + h, pb));
    tk->decay = expf((z0 > 20.0f ? z0 : log1pf(expf(z0))) * a[h]);
}

/* columns [j0, j0 + n) of the first token's ks, qs */
static inline void read_block(const float *S, int64_t dk, int64_t dv, int64_t j0, int64_t n, const Token *tk,
                              float *ks, float *qs) {
    float x[JB] = {0}, y[JB] = {0};
    for (int64_t i = 0; i < dk; i++) {
        const float *row = S + i * dv + j0, ki = tk->k[i], qi = tk->q[i];
        for (int64_t j = 0; j < n; j++) { x[j] += ki * row[j]; y[j] += qi * row[j]; }
    }
    for (int64_t j = 0; j < n; j++) { ks[j0 + j] = x[j]; qs[j0 + j] = y[j]; }
}

/* columns [j0, j0 + n): S = e S + k delta^T, and (next != NULL) next's ks, qs over the new S */
static inline void update_block(float *S, int64_t dk, int64_t dv, int64_t j0, int64_t n, const Token *tk,
                                const float *delta, const Token *next, float *ks, float *qs) {
    float d[JB], x[JB] = {0}, y[JB] = {0};
    const float e = tk->decay;
    for (int64_t j = 0; j < n; j++) d[j] = delta[j0 + j];
    for (int64_t i = 0; i < dk; i++) {
        float *row = S + i * dv + j0;
        const float ki = tk->k[i];
        if (next) {
            const float ni = next->k[i], mi = next->q[i];
            for (int64_t j = 0; j < n; j++) {
                const float r = e * row[j] + ki * d[j];
                row[j] = r;
                x[j] += ni * r;
                y[j] += mi * r;
            }
        } else {
            for (int64_t j = 0; j < n; j++) row[j] = e * row[j] + ki * d[j];
        }
    }
    if (next) for (int64_t j = 0; j < n; j++) { ks[j0 + j] = x[j]; qs[j0 + j] = y[j]; }
}

static void scan_head(const void *proj, const float *xc, float *ssm, int64_t s, const float *dt_bias, const float *a,
                      const float *norm, void *out, int64_t first, int64_t len, int64_t h, int64_t sp, int64_t so,
                      int64_t n_k, int64_t H, int64_t dk, int64_t dv, float eps, int pb, int ob) {
    const int64_t key = n_k * dk, C = 2 * key + H * dv, kh = h % n_k;
    Token tk[2];
    float ks[MAX_D], qs[MAX_D], delta[MAX_D], o[MAX_D];
    float *S = ssm + (s * H + h) * dk * dv;
    prepare(&tk[0], proj, xc, first, h, kh, sp, C, key, H, dv, dk, dt_bias, a, eps, pb);
    for (int64_t j0 = 0; j0 < dv; j0 += JB) {
        if (dv - j0 >= JB) read_block(S, dk, dv, j0, JB, &tk[0], ks, qs);
        else read_block(S, dk, dv, j0, dv - j0, &tk[0], ks, qs);
    }
    for (int64_t t = first; t < first + len; t++) {
        const Token *cur = &tk[(t - first) & 1];
        Token *next = t + 1 < first + len ? &tk[(t - first + 1) & 1] : NULL;
        const float *v = xc + t * C + 2 * key + h * dv;
        float ss = 0.0f;
        for (int64_t j = 0; j < dv; j++) {
            delta[j] = cur->beta * (v[j] - cur->decay * ks[j]);
            o[j] = cur->decay * qs[j] + cur->kq * delta[j];
            ss += o[j] * o[j];
        }
        const float r = 1.0f / sqrtf(ss / (float)dv + eps);
        for (int64_t j = 0; j < dv; j++) {
            const float z = ld(proj, t * sp + C + h * dv + j, pb);
            st(out, t * so + h * dv + j, ob, o[j] * r * norm[j] * (z * sigm(z)));
        }
        if (next) prepare(next, proj, xc, t + 1, h, kh, sp, C, key, H, dv, dk, dt_bias, a, eps, pb);
        for (int64_t j0 = 0; j0 < dv; j0 += JB) {
            if (dv - j0 >= JB) update_block(S, dk, dv, j0, JB, cur, delta, next, ks, qs);
            else update_block(S, dk, dv, j0, dv - j0, cur, delta, next, ks, qs);
        }
    }
}

int delta_net_step(const void *proj, float *conv, float *ssm, const int64_t *streams, const int64_t *offsets,
                   const int64_t *lens, const float *taps, const float *dt_bias, const float *a, const float *norm,
                   void *out, int64_t B, int64_t T, int64_t sp, int64_t so, int64_t n_k, int64_t H, int64_t dk,
                   int64_t dv, int64_t d_conv, float eps, int pb, int ob, int n_threads) {
    if (dk > MAX_D || dv > MAX_D || n_k < 1 || H % n_k || d_conv < 1 || d_conv > 8) return 2;
    for (int64_t b = 0; b < B; b++)
        if (offsets[b] < 0 || lens[b] < 0 || offsets[b] + lens[b] > T) return 3;
    const int64_t C = 2 * n_k * dk + H * dv, blocks = (C + CAUSAL_CONV_BLOCK - 1) / CAUSAL_CONV_BLOCK;
    float *xc = malloc((size_t)(T * C) * sizeof(float));
    if (!xc) return 1;
    #pragma omp parallel num_threads(n_threads) if (T * H > 1)
    {
        #pragma omp for schedule(dynamic, 1)
        for (int64_t i = 0; i < B * blocks; i++) {   /* a sequence's channel block, its rows in order */
            const int64_t b = i / blocks, c0 = (i % blocks) * CAUSAL_CONV_BLOCK;
            causal_conv_silu(proj, conv + streams[b] * (d_conv - 1) * C, taps, NULL, xc, offsets[b], lens[b], sp, 0, C,
                             d_conv, pb, c0, c0 + CAUSAL_CONV_BLOCK < C ? c0 + CAUSAL_CONV_BLOCK : C);
        }
        #pragma omp for schedule(dynamic, 1)
        for (int64_t i = 0; i < B * H; i++)   /* a sequence's head, its rows in order */
            if (lens[i / H])
                scan_head(proj, xc, ssm, streams[i / H], dt_bias, a, norm, out, offsets[i / H], lens[i / H], i % H, sp,
                          so, n_k, H, dk, dv, eps, pb, ob);
    }
    free(xc);
    return 0;
}
