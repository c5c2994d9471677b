/* sigmoid_gate.c: sigmoid_gate of slotserver/model/sigmoid_gate.py. Compiled with native.PRELUDE
   (slotserver/runtime/prelude.h) in front (ld, st, bf2f, f2bf). */
/* y[r * ly + c] *= sigmoid(g[r * lg + c]) for r < rows, c < cols; y float32 or bf16 (`yb`), g float32
   or bf16 (`gb`). sigmoid(x) = 1 / (1 + e^-x) in float32 (the prelude's fast_exp, 2e-7 relative: it
   vectorizes, libm's expf does not), rounded to y's dtype before the product (as torch's
   `y * torch.sigmoid(g.float()).to(y.dtype)`). Rows over the threads from 64 rows (a prompt). */
int sigmoid_gate(void *y, const void *g, int64_t rows, int64_t cols, int64_t ly, int64_t lg, int yb, int gb,
                 int n_threads) {
    #pragma omp parallel for num_threads(n_threads) if (rows >= 64) schedule(static)
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++) {
            float s = 1.0f / (1.0f + fast_exp(-ld(g, r * lg + c, gb)));
            if (yb) s = bf2f(f2bf(s));
            st(y, r * ly + c, yb, ld(y, r * ly + c, yb) * s);
        }
    return 0;
}
