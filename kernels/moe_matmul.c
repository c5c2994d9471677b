/* moe_matmul.c: the CPU kernel of kernels/moe_matmul.py. It calls qmatmul_r16 (kernels/qmatmul.c,
   the repacked 16-row integer GEMM) on each expert's weights through `r16`, a pointer into
   qmatmul's library that the module passes (one compiled copy of qmatmul.c, not two).

   y[t, j, :] = x[t(, j)] . W[ids[t, j]]^T for every token t and selected slot j, where W[e] is
   expert e's rows: the concatenation of its rows in each part (gate then up, or down), each part
   repacked on its own (offs[e, p] = byte offsets of its U and scales, part_n[p] its rows).

   The (t, j) rows are grouped by expert, in (t, j) order within an expert, gathered into one
   float32 buffer, and each (expert used, part) is one qmatmul_r16 on the expert's m rows: its
   weight bytes are read once per call whatever m (prefill: every token routed to it), and an
   expert no row selected is never read (decode: only the active experts' bytes). A row's floats
   do not depend on the others (qmatmul_r16 quantizes each activation row alone and runs every M
   through the same dots): batch invariance holds as for the dense layers.

   Threads: with at least 2 work items (expert, part) per thread, one parallel region hands them
   out (largest first) and each runs on one thread; with fewer (decode of a few experts on many
   threads), the items run one after the other, each on all threads. Why: a qmatmul_r16 of a
   decode's 1-2 rows is a few microseconds of work behind its own fork/join, and 16 experts x 3
   parts x layers of them per step spent more time in barriers than in dots (on a 2-core host
   shared with other work a barrier waits for a descheduled thread's whole time slice).

   glu: each input row is gate|up [2K] and goes through silu(gate) * up first (1: qmatmul_r16's fused
   prologue), or gpt-oss's clamped SwiGLU (2: ggml's swiglu_oai, applied here while gathering the
   rows, oai_row); without a gate, 3 makes each row max(x, 0)^2 while gathering it (Nemotron-H's
   ungated experts: ggml_relu then ggml_sqr).
   bias: NULL, or [E, N] float32: each slot's row gets its expert's bias (gpt-oss),
   before its routing weight, as llama.cpp adds it (ggml_add_id, then ggml_mul by the weights). w: NULL, or the routing weights [T, kk]: then y is [T, N], each token's sum over its
   slots j = 0, 1, ... (in that order, as llama.cpp adds them) of w[t, j] * its row; accum: that
   sum added into y (the residual) instead of stored.
   Returns 0, 1 (out of memory), 2 (an expert id out of range) or qmatmul_r16's code. */
#include <math.h>
#include <string.h>

typedef int (*R16Fn)(const uint8_t *U, const void *D, const void *x, void *y, const void *gw, int64_t M, int64_t N,
                     int64_t K, int64_t sx, int64_t sy, float eps, int xb, int yb, int gwb, int glu, int accum, int form,
                     int off, int n_threads);
typedef struct { int64_t e, p, m; } MoeItem;

static int moe_item_cmp(const void *a, const void *b) {   /* more rows first; then expert, part: a fixed order */
    const MoeItem *x = a, *y = b;
    if (x->m != y->m) return x->m < y->m ? 1 : -1;
    return x->e != y->e ? (x->e < y->e ? -1 : 1) : (x->p < y->p ? -1 : x->p > y->p);
}

/* ggml-cpu's swiglu_oai (alpha 1.702, limit 7) of one gate|up row x [2K] into dst [K], in its order:
   min(gate, 7), clamp(up, -7, 7), g / (1 + e^(1.702 * -g)) * (u + 1). */
static void oai_row(const float *x, int64_t K, float *dst) {
    for (int64_t i = 0; i < K; i++) {
        const float g = x[i] < 7.0f ? x[i] : 7.0f, up = x[K + i];
        const float u = up < -7.0f ? -7.0f : (up > 7.0f ? 7.0f : up);
        dst[i] = g / (1.0f + expf(1.702f * -g)) * (u + 1.0f);
    }
}

/* The rows grouped by expert into xg (Kg floats each): copied, (act 2, oai) activated from 2 Kg, or
   (act 3) squared after a ReLU. */
static int moe_group(const int64_t *ids, const float *x, int64_t R, int64_t kk, int64_t Kg, int act, int64_t sxt,
                     int64_t sxj, int64_t E, int64_t *start, int64_t *pos, float *xg) {
    for (int64_t r = 0; r < R; r++) {
        if (ids[r] < 0 || ids[r] >= E) return 2;
        start[ids[r] + 1]++;
    }
    for (int64_t e = 0; e < E; e++) start[e + 1] += start[e];   /* start[e]: expert e's first gathered row */
    int64_t *fill = calloc(E, sizeof(int64_t));
    if (!fill) return 1;
    for (int64_t r = 0; r < R; r++) {
        const int64_t g = start[ids[r]] + fill[ids[r]]++;
        pos[r] = g;
        const float *src = x + (r / kk) * sxt + (r % kk) * sxj;
        if (act == 2) oai_row(src, Kg, xg + g * Kg);
        else if (act == 3)
            for (int64_t i = 0; i < Kg; i++) { const float v = src[i] > 0.0f ? src[i] : 0.0f; xg[g * Kg + i] = v * v; }
        else memcpy(xg + g * Kg, src, Kg * sizeof(float));
    }
    free(fill);
    return 0;
}

int moe_matmul(const void *r16, const uint8_t *U, const uint8_t *S, const int64_t *offs, const int64_t *part_n,
               const float *x,
               float *y, const int64_t *ids, const float *w, const float *bias, int64_t T, int64_t kk, int64_t P,
               int64_t K, int64_t sxt, int64_t sxj, int64_t E, int glu, int accum, int form, int off, int n_threads) {
    const int64_t R = T * kk, Kx = glu == 1 ? 2 * K : K;   /* gathered floats per row (oai: activated, K) */
    int64_t N = 0, *col = malloc((P + 1) * sizeof(int64_t));
    for (int64_t p = 0; p < P && col; p++) { col[p] = N; N += part_n[p]; }
    int64_t *start = calloc(E + 1, sizeof(int64_t)), *pos = malloc((R + 1) * sizeof(int64_t));
    float *xg = malloc((R * Kx + 16) * sizeof(float)), *yg = malloc((R * N + 16) * sizeof(float));
    MoeItem *items = malloc((E * P + 1) * sizeof(MoeItem));
    int rc = (!col || !start || !pos || !xg || !yg || !items) ? 1 : 0;
    if (!rc) rc = moe_group(ids, x, R, kk, Kx, glu, sxt, sxj, E, start, pos, xg);
    int64_t n_items = 0;
    for (int64_t e = 0; e < E && !rc; e++)
        for (int64_t p = 0; p < P && start[e + 1] > start[e]; p++)
            items[n_items++] = (MoeItem){e, p, start[e + 1] - start[e]};
    if (!rc) qsort(items, n_items, sizeof(MoeItem), moe_item_cmp);
    const int spread = n_items >= 2 * n_threads;   /* items over the threads, each on one */
    #pragma omp parallel for num_threads(n_threads) schedule(dynamic, 1) reduction(|: rc) if (spread && !rc)
    for (int64_t i = 0; i < n_items; i++) {
        const int64_t e = items[i].e, p = items[i].p;
        if (rc) continue;
        rc |= ((R16Fn)r16)(U + offs[2 * (e * P + p)], S + offs[2 * (e * P + p) + 1], xg + start[e] * Kx,
                          yg + start[e] * N + col[p], NULL, items[i].m, part_n[p], K, Kx, N, 0.0f, 0, 0, 0, glu == 1, 0,
                          form, off, spread ? 1 : n_threads);
        if (bias && !rc) {   /* the expert's bias on each of its rows (this item's columns) */
            const float *b = bias + e * N + col[p];
            float *yb = yg + start[e] * N + col[p];
            for (int64_t r = 0; r < items[i].m; r++)
                for (int64_t n = 0; n < part_n[p]; n++) yb[r * N + n] += b[n];
        }
    }
    float *row = accum ? malloc(N * sizeof(float) + 64) : NULL;
    if (accum && !row) rc = 1;
    for (int64_t t = 0; t < T && !rc; t++) {
        if (!w) {
            for (int64_t j = 0; j < kk; j++) memcpy(y + (t * kk + j) * N, yg + pos[t * kk + j] * N, N * sizeof(float));
            continue;
        }
        float *out = accum ? row : y + t * N;
        const float *y0 = yg + pos[t * kk] * N;
        for (int64_t n = 0; n < N; n++) out[n] = w[t * kk] * y0[n];
        for (int64_t j = 1; j < kk; j++) {
            const float *yj = yg + pos[t * kk + j] * N, wj = w[t * kk + j];
            for (int64_t n = 0; n < N; n++) out[n] += wj * yj[n];
        }
        if (accum) for (int64_t n = 0; n < N; n++) y[t * N + n] += row[n];   /* the residual + the sum, as llama.cpp */
    }
    free(row); free(col); free(start); free(pos); free(xg); free(yg); free(items);
    return rc;
}
