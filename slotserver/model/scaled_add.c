/* scaled_add.c: scaled_add and scale_rows of slotserver/model/scaled_add.py. Compiled with
   native.PRELUDE (slotserver/runtime/prelude.h) in front (ld, bf2f, f2bf). No FMA contraction:
   each product is rounded before the add, as torch's `x + y * s` and ggml's scale-then-add. */
#pragma GCC optimize("fp-contract=off")
#pragma STDC FP_CONTRACT OFF
/* x[r * lx + c] += s * y[r * ly + c]; x float32, y float32 or bf16 (`yb`: the product rounded to
   bf16 first, as torch's bf16 `y * s`). Rows over the threads from 64 rows. */
int scaled_add(float *x, const void *y, int64_t rows, int64_t cols, int64_t lx, int64_t ly, float s, int yb,
               int n_threads) {
    #pragma omp parallel for num_threads(n_threads) if (rows >= 64) schedule(static)
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++) {
            float t = ld(y, r * ly + c, yb) * s;
            if (yb) t = bf2f(f2bf(t));
            x[r * lx + c] += t;
        }
    return 0;
}

/* x[r * lx + c] *= s (float32). */
int scale_rows(float *x, int64_t rows, int64_t cols, int64_t lx, float s, int n_threads) {
    #pragma omp parallel for num_threads(n_threads) if (rows * cols >= (1 << 20)) schedule(static)
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++) x[r * lx + c] *= s;
    return 0;
}
