/* bias_add.c: add_bias of slotserver/model/bias_add.py. Compiled with native.PRELUDE
   (slotserver/runtime/prelude.h) in front (bf2f, f2bf). */
/* y[r * ld + c] += b[c] for r < rows, c < cols; b float32, y float32 or bf16 (`bf16`: b rounded to
   bf16 first, as torch's add of b.to(bf16) does). */
int add_bias(void *y, const float *b, int64_t rows, int64_t cols, int64_t ld, int bf16) {
    for (int64_t r = 0; r < rows; r++) {
        if (bf16) {
            uint16_t *o = (uint16_t *)y + r * ld;
            for (int64_t c = 0; c < cols; c++) o[c] = f2bf(bf2f(o[c]) + bf2f(f2bf(b[c])));
        } else {
            float *o = (float *)y + r * ld;
            for (int64_t c = 0; c < cols; c++) o[c] += b[c];
        }
    }
    return 0;
}
