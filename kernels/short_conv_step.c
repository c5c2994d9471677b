/* short_conv_step.c: the CPU kernel of kernels/short_conv_step.py (compiled with native.PRELUDE in
   front: ld, st).

   A forward step's rows through LFM2's short convolution: proj [T, 3 d] (row stride sp; float32,
   or bf16 with pb) = b | c | x. Sequence n owns rows offsets[n] .. + lens[n] - 1 (its tokens in
   order) and continues stream streams[n]: its last w = L - 1 inputs conv[s] [w, d] (float32,
   oldest first, updated in place). Per row and channel i, with u = b_i x_i: y = sum_j window[j]
   taps[i, j] over window = (the w stored inputs, u), the stored inputs shift by one (u last);
   out[t, i] = c_i y (row stride so; float32, or bf16 with ob). Each (sequence, channel) alone, its
   rows in order: a row's floats depend neither on the batch nor on how a prompt was cut. */
#define BLOCK 512
int short_conv_step(const void *proj, float *conv, const int64_t *streams, const int64_t *offsets, const int64_t *lens,
                    const float *taps, void *out, int64_t B, int64_t T, int64_t sp, int64_t so, int64_t d, int64_t L,
                    int pb, int ob, int n_threads) {
    const int64_t w = L - 1, blocks = (d + BLOCK - 1) / BLOCK;
    for (int64_t n = 0; n < B; n++)
        if (offsets[n] < 0 || lens[n] < 0 || offsets[n] + lens[n] > T) return 3;
    #pragma omp parallel for num_threads(n_threads) if (T * d >= 16384) schedule(dynamic, 1)
    for (int64_t k = 0; k < B * blocks; k++) {
        const int64_t n = k / blocks, i0 = (k % blocks) * BLOCK, i1 = i0 + BLOCK < d ? i0 + BLOCK : d;
        float *s = conv + streams[n] * w * d;
        for (int64_t t = offsets[n]; t < offsets[n] + lens[n]; t++)
            for (int64_t i = i0; i < i1; i++) {
                const float u = ld(proj, t * sp + i, pb) * ld(proj, t * sp + 2 * d + i, pb);
                const float *tp = taps + i * L;
                float y = 0.0f;
                for (int64_t j = 0; j < w; j++) y += s[j * d + i] * tp[j];
                y += u * tp[w];
                for (int64_t j = 0; j + 1 < w; j++) s[j * d + i] = s[(j + 1) * d + i];
                if (w > 0) s[(w - 1) * d + i] = u;
                st(out, t * so + i, ob, ld(proj, t * sp + d + i, pb) * y);
            }
    }
    return 0;
}
