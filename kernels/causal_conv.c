/* causal_conv.c: the causal depthwise convolution of a hybrid model's recurrent layers, then SiLU,
   compiled in front of kernels/delta_net_step.c and mamba2_step.c (native.joined; native.PRELUDE
   first: ld, fast_exp).

   Channels [c0, c1) of one sequence's rows first .. first + len - 1, in order: row r's inputs are
   proj[r * sp + off + c] (float32, or bf16 with pb); y = bias[c] (bias may be NULL: 0) + sum_j
   window[j] taps[c * d_conv + j] over window = (the stream's w = d_conv - 1 stored inputs, at
   state[j * C + c] oldest first, then this one); the stored inputs shift by one; xc[r * C + c] =
   silu(y). Each step a loop over the block's channels, contiguous: the taps transposed into tt
   first (a gather of taps[c * d_conv + j] in the channel loop kept it scalar, and the convolution
   was most of a prompt's time). d_conv <= 8, c1 - c0 <= CAUSAL_CONV_BLOCK. */
#define CAUSAL_CONV_BLOCK 512

/* the prelude's fast_exp (relative error ~2e-7): a loop of libm expf calls does not vectorize */
static inline float sigm(float x) { return 1.0f / (1.0f + fast_exp(-x)); }

static void causal_conv_silu(const void *proj, float *state, const float *taps, const float *bias, float *xc,
                             int64_t first, int64_t len, int64_t sp, int64_t off, int64_t C, int64_t d_conv, int pb,
                             int64_t c0, int64_t c1) {
    const int64_t w = d_conv - 1, n = c1 - c0;
    float tt[8][CAUSAL_CONV_BLOCK], x[CAUSAL_CONV_BLOCK], y[CAUSAL_CONV_BLOCK];
    state += c0;
    for (int64_t j = 0; j < d_conv; j++)
        for (int64_t c = 0; c < n; c++) tt[j][c] = taps[(c0 + c) * d_conv + j];
    for (int64_t r = first; r < first + len; r++) {
        for (int64_t c = 0; c < n; c++) x[c] = ld(proj, r * sp + off + c0 + c, pb);
        for (int64_t c = 0; c < n; c++) y[c] = bias ? bias[c0 + c] : 0.0f;
        for (int64_t j = 0; j < w; j++)
            for (int64_t c = 0; c < n; c++) y[c] += state[j * C + c] * tt[j][c];
        for (int64_t j = 0; j + 1 < w; j++)
            for (int64_t c = 0; c < n; c++) state[j * C + c] = state[(j + 1) * C + c];
        float *out = xc + r * C + c0;
        for (int64_t c = 0; c < n; c++) {
            const float v = y[c] + x[c] * tt[w][c];
            if (w > 0) state[(w - 1) * C + c] = x[c];
            out[c] = v * sigm(v);
        }
    }
}
