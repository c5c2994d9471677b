/* relu_sqr.c: relu_sqr of slotserver/model/relu_sqr.py. Compiled with native.PRELUDE
   (slotserver/runtime/prelude.h) in front (ld, st). */
/* y[r * ly + c] = max(y, 0)^2 for r < rows, c < cols, in place; y float32 or bf16 (`yb`): the
   square in float32, rounded once to y's dtype (torch's `torch.relu(y).square()` in either; a
   bf16 product is computed in float and rounded, as here). Rows over the threads from 64 rows. */
int relu_sqr(void *y, int64_t rows, int64_t cols, int64_t ly, int yb, int n_threads) {
    #pragma omp parallel for num_threads(n_threads) if (rows >= 64) schedule(static)
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++) {
            float v = ld(y, r * ly + c, yb);
            v = v > 0.0f ? v : 0.0f;
            st(y, r * ly + c, yb, v * v);
        }
    return 0;
}
