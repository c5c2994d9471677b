/* short_conv_step.c: the CPU kernel of kernels/short_conv_step.py (compiled with native.PRELUDE in
   front: ld, st).

   One token on each of B sequences through LFM2's short convolution: proj [B, 3 d] (row stride
   sp; float32, or bf16 with pb) = b | c | x; per channel i, with u = b_i x_i and the stream's last
   w = L - 1 inputs conv[s] [w, d] (float32, oldest first, updated in place: shifted by one, u
   last): y = sum_j window[j] taps[i, j] over window = (the w inputs, u); out[b, i] = c_i y (row
   stride so; float32, or bf16 with ob). Each (row, channel) alone: a row's floats do not depend
   on the batch. */
#define BLOCK 512
int short_conv_step(const void *proj, float *conv, const int64_t *streams, const float *taps, void *out, int64_t B,
                    int64_t sp, int64_t so, int64_t d, int64_t L, int pb, int ob, int n_threads) {
    const int64_t w = L - 1, blocks = (d + BLOCK - 1) / BLOCK;
    #pragma omp parallel for num_threads(n_threads) if (B * d >= 16384) schedule(static)
    for (int64_t n = 0; n < B * blocks; n++) {
        const int64_t b = n / blocks, i0 = (n % blocks) * BLOCK, i1 = i0 + BLOCK < d ? i0 + BLOCK : d;
        float *s = conv + streams[b] * w * d;
        for (int64_t i = i0; i < i1; i++) {
            const float u = ld(proj, b * sp + i, pb) * ld(proj, b * sp + 2 * d + i, pb);
            const float *t = taps + i * L;
            float y = 0.0f;
            for (int64_t j = 0; j < w; j++) y += s[j * d + i] * t[j];
            y += u * t[w];
            for (int64_t j = 0; j + 1 < w; j++) s[j * d + i] = s[(j + 1) * d + i];
            if (w > 0) s[(w - 1) * d + i] = u;
            st(out, b * so + i, ob, ld(proj, b * sp + d + i, pb) * y);
        }
    }
    return 0;
}
