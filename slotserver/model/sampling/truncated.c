/* sample_truncated.c: draw_rows, the one native pass of slotserver/model/sampling/truncated.py (why,
   and when it applies: that module's docstring). Compiled with native.PRELUDE
   (slotserver/runtime/prelude.h) in front. */
#if defined(__AVX2__)
#include <immintrin.h>
#endif

#define MAX_K 256

/* Insert x (index i) into the n best of cv/ci (value descending; on equal values the earlier index
   first, as a stable sort), keeping at most w; -> the new count. */
static inline int64_t insert(float *cv, int64_t *ci, int64_t n, int64_t w, float x, int64_t i) {
    int64_t p = n;
    while (p > 0 && cv[p - 1] < x) p--;
    if (p >= w) return n;
    const int64_t last = n < w ? n : w - 1;
    for (int64_t j = last; j > p; j--) { cv[j] = cv[j - 1]; ci[j] = ci[j - 1]; }
    cv[p] = x; ci[p] = i;
    return n < w ? n + 1 : n;
}

/* The w largest finite values of x[0..V) -> their count (< w when fewer are finite); *nan set if any
   value is NaN. Blocks of 8 with no value above the current w-th skip the scalar insertion. */
static int64_t top_w(const float *x, int64_t V, int64_t w, float *cv, int64_t *ci, int *nan) {
    int64_t n = 0, i = 0;
    float thr = -INFINITY;   /* the w-th value once n == w; -inf (nothing finite is refused) before */
#if defined(__AVX2__)
    for (; i + 8 <= V; i += 8) {
        const __m256 v = _mm256_loadu_ps(x + i);
        const __m256 hit = _mm256_or_ps(_mm256_cmp_ps(v, _mm256_set1_ps(thr), _CMP_GT_OQ),
                                        _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
        if (!_mm256_movemask_ps(hit)) continue;
        for (int k = 0; k < 8; k++) {
            const float y = x[i + k];
            if (y != y) { *nan = 1; continue; }
            if (y > thr) { n = insert(cv, ci, n, w, y, i + k); if (n == w) thr = cv[w - 1]; }
        }
    }
#endif
    for (; i < V; i++) {
        const float y = x[i];
        if (y != y) { *nan = 1; continue; }
        if (y > thr) { n = insert(cv, ci, n, w, y, i); if (n == w) thr = cv[w - 1]; }
    }
    return n;
}

/* row.py's keep_length (a closed row: its whole top_k prefix in view) and draw, in doubles, in the
   same order of operations; the top_p normaliser's sum in long double where row.py calls math.fsum
   (within an ulp of it: a token changes only if a cumulative sum lands that close to top_p). No
   reassociation or contraction here: the sums run in row.py's order. */
#if defined(__clang__)
static int64_t keep_draw(const float *cv, int64_t n, double top_p, double min_p, double temp, double u) {
    #pragma clang fp reassociate(off) contract(off)
#else
__attribute__((optimize("no-associative-math", "fp-contract=off")))
static int64_t keep_draw(const float *cv, int64_t n, double top_p, double min_p, double temp, double u) {
#endif
    const double top = cv[0];
    int64_t n_p = n + 1;
    if (top_p < 1) {
        long double s = 0;
        for (int64_t j = 0; j < n; j++) s += (long double)exp((double)cv[j] - top);
        const double norm = top + log((double)s);
        double cum = 0;
        for (int64_t j = 0; j < n; j++) {
            cum += exp((double)cv[j] - norm);
            if (cum >= top_p) { n_p = j + 1; break; }
        }
    }
    int64_t n_min = n;
    if (min_p > 0) {
        const double floor_ = top + log(min_p);
        for (int64_t j = 0; j < n; j++) if ((double)cv[j] < floor_) { n_min = j; break; }
    }
    int64_t keep = n < n_p ? n : n_p;
    keep = keep < n_min ? keep : n_min;
    keep = keep > 1 ? keep : 1;
    double cdf[MAX_K], total = 0;
    for (int64_t j = 0; j < keep; j++) { total += exp(((double)cv[j] - top) / temp); cdf[j] = total; }
    double target = u * total;
    const double below = nextafter(total, 0.0);
    target = target < below ? target : below;
    int64_t k = 0;
    while (k < keep && cdf[k] <= target) k++;   /* bisect_right: the first column above the target */
    return k < keep - 1 ? k : keep - 1;
}

/* penalties.py's apply_penalties_ on one token: float32, each operation rounded as torch rounds it
   (no fused multiply-add: the volatile product is rounded before the add, whatever the compiler). */
static float penalized(float old, float count, float rep, float freq, float pres) {
    const float scaled = old > 0 ? old / rep : old * rep;
    volatile float times = count * freq;
    return scaled - (times + pres);
}

/* Row b: x = logits[b] with biases (ids[o[b] .. o[b+1]) added in turn, then the repeat, frequency
   and presence penalties pen[b] = (rep, freq, pres) on the tokens pids[po[b] .. po[b+1]) seen
   pcount times in its window, in scratch row b) -> its top_k[b] best (1 for a greedy row,
   temp[b] <= 0) in cv/ci row b (MAX_K apart), their count in n[b]. Returns the first row whose values
   hold a NaN or none finite, or -1: then no row is drawn, so no row's random stream has moved (the
   caller's row-by-row retry draws as a batch would). */
int select_rows(const float *logits, float *scratch, const int64_t *o, const int64_t *ids, const float *vals,
                const int64_t *po, const int64_t *pids, const int64_t *pcount, const float *pen,
                const int64_t *top_k, const double *temp, float *cv, int64_t *ci, int64_t *n,
                int64_t B, int64_t V, int64_t sl, int64_t nthreads) {
    int bad = -1;
    #pragma omp parallel for num_threads(nthreads) schedule(static) if(nthreads > 1 && B > 1)
    for (int64_t b = 0; b < B; b++) {
        const float *x = logits + b * sl;
        if (o[b + 1] > o[b] || po[b + 1] > po[b]) {
            float *row = scratch + b * V;
            memcpy(row, x, V * sizeof(float));
            for (int64_t j = o[b]; j < o[b + 1]; j++) row[ids[j]] += vals[j];
            for (int64_t j = po[b]; j < po[b + 1]; j++)
                row[pids[j]] = penalized(row[pids[j]], (float)pcount[j], pen[3 * b], pen[3 * b + 1], pen[3 * b + 2]);
            x = row;
        }
        int nan = 0;
        const int64_t w = temp[b] <= 0 ? 1 : top_k[b];
        n[b] = top_w(x, V, w, cv + b * MAX_K, ci + b * MAX_K, &nan);
        if (nan || n[b] == 0 || !isfinite(cv[b * MAX_K])) {
            #pragma omp critical
            { if (bad < 0 || b < bad) bad = (int)b; }
        }
    }
    return bad;
}

/* Each row's token from select_rows' candidates: the first (greedy) or the one drawn at u[b]. */
int draw_rows(const float *cv, const int64_t *ci, const int64_t *n, const double *top_p, const double *min_p,
              const double *temp, const double *u, int64_t *tok, int64_t B) {
    for (int64_t b = 0; b < B; b++) {
        const float *c = cv + b * MAX_K;
        tok[b] = ci[b * MAX_K + (temp[b] <= 0 ? 0 : keep_draw(c, n[b], top_p[b], min_p[b], temp[b], u[b]))];
    }
    return 0;
}
