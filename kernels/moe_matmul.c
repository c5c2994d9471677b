/* moe_matmul.c: the CPU kernel of kernels/moe_matmul.py, compiled after kernels/qmatmul.c (one
   library: it calls qmatmul_r16, the repacked 16-row integer GEMM, on each expert's weights).

   y[t, j, :] = x[t(, j)] . W[ids[t, j]]^T for every token t and selected slot j, where W[e] is
   expert e's rows: the concatenation of its rows in each part (gate then up, or down), each part
   repacked on its own (offs[e, p] = byte offsets of its U and scales, part_n[p] its rows).

   The (t, j) rows are grouped by expert, in (t, j) order within an expert, gathered into one
   float32 buffer, and each expert used runs one qmatmul_r16 per part on its m rows: its weight
   bytes are read once per call whatever m (prefill: every token routed to it), and an expert no
   row selected is never read (decode: only the active experts' bytes). A row's floats do not
   depend on the others (qmatmul_r16 quantizes each activation row alone and runs every M through
   the same dots): batch invariance holds as for the dense layers.

   glu: each input row is gate|up [2K] and goes through silu(gate) * up first (qmatmul_r16's fused
   prologue). Returns 0, 1 (out of memory), 2 (an expert id out of range) or qmatmul_r16's code. */
int moe_matmul(const uint8_t *U, const uint8_t *S, const int64_t *offs, const int64_t *part_n, const float *x,
               float *y, const int64_t *ids, int64_t T, int64_t kk, int64_t P, int64_t K, int64_t sxt, int64_t sxj,
               int64_t E, int glu, int form, int off, int n_threads) {
    const int64_t R = T * kk, Kx = glu ? 2 * K : K;
    int64_t N = 0;
    for (int64_t p = 0; p < P; p++) N += part_n[p];
    int64_t *start = calloc(E + 1, sizeof(int64_t)), *order = malloc((R + 1) * sizeof(int64_t));
    float *xg = malloc((R * Kx + 16) * sizeof(float)), *yg = malloc((R * N + 16) * sizeof(float));
    int rc = (!start || !order || !xg || !yg) ? 1 : 0;
    for (int64_t r = 0; r < R && !rc; r++) {
        if (ids[r] < 0 || ids[r] >= E) rc = 2;
        else start[ids[r] + 1]++;
    }
    if (!rc) {
        for (int64_t e = 0; e < E; e++) start[e + 1] += start[e];   /* start[e]: expert e's first gathered row */
        int64_t *fill = calloc(E, sizeof(int64_t));
        if (!fill) rc = 1;
        for (int64_t r = 0; r < R && !rc; r++) {
            const int64_t g = start[ids[r]] + fill[ids[r]]++;
            order[g] = r;
            memcpy(xg + g * Kx, x + (r / kk) * sxt + (r % kk) * sxj, Kx * sizeof(float));
        }
        free(fill);
    }
    for (int64_t e = 0; e < E && !rc; e++) {
        const int64_t m = start[e + 1] - start[e];
        int64_t col = 0;
        for (int64_t p = 0; p < P && m && !rc; p++) {
            rc = qmatmul_r16(U + offs[2 * (e * P + p)], S + offs[2 * (e * P + p) + 1], xg + start[e] * Kx,
                             yg + start[e] * N + col, NULL, m, part_n[p], K, Kx, N, 0.0f, 0, 0, 0, glu, 0, form, off,
                             n_threads);
            col += part_n[p];
        }
    }
    for (int64_t g = 0; g < R && !rc; g++)
        memcpy(y + order[g] * N, yg + g * N, N * sizeof(float));
    free(start); free(order); free(xg); free(yg);
    return rc;
}
