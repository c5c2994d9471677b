/* moe_route.c: the CPU kernel of kernels/moe_route.py (compiled with native.PRELUDE in front).

   Per token row t of h [T, d] (float32, row stride sh): the router logits against W [E, d]
   (float64), each a float64 sum of float32 * float64 products in index order, rounded to float32
   once (the same floats whatever the batch), plus bias[e] where there is a bias (gpt-oss's
   ffn_gate_inp.bias, a float32 add as ggml's); then as llama.cpp's build_moe_ffn:
     gating 0 (softmax): p = softmax(logits) in float32 (max subtracted, expf, one division each);
     gating 1 (softmax_weight): p = logits;
     gating 2 (sigmoid): p = 1 / (1 + expf(-logit));
   the k largest p + sel[e] (`sel`: a selection bias, lfm2moe's exp_probs_b; none: p) (ties: the
   lower expert id first), in descending order -> ids[t, :];
   their p (unbiased) -> w[t, :], then softmax over the k (gating 1), then divided by their sum
   clamped at 6.1e-5 (norm), then times scale (scale != 1).
   Rows split over the threads from 64 rows (prefill); a decode step's few rows stay on one. */
#include <math.h>

int moe_route(const float *h, const double *W, const float *bias, const float *sel, int64_t *ids, float *w,
              int64_t T, int64_t d, int64_t E, int64_t k, int64_t sh, int gating, int norm, float scale,
              int n_threads) {
    if (k < 1 || k > E || E > 4096) return 2;
    #pragma omp parallel for num_threads(n_threads) if (T >= 64) schedule(static)
    for (int64_t t = 0; t < T; t++) {
        float p[4096], q[4096];   /* probabilities, and what selects (p + sel) */
        const float *x = h + t * sh;
        for (int64_t e = 0; e < E; e++) {
            const double *we = W + e * d;
            double s = 0.0;
            for (int64_t i = 0; i < d; i++) s += (double)x[i] * we[i];
            p[e] = (float)s;
            if (bias) p[e] += bias[e];
        }
        if (gating == 0) {
            float mx = p[0], sum = 0.0f;
            for (int64_t e = 1; e < E; e++) mx = p[e] > mx ? p[e] : mx;
            for (int64_t e = 0; e < E; e++) { p[e] = expf(p[e] - mx); sum += p[e]; }
            for (int64_t e = 0; e < E; e++) p[e] = p[e] / sum;
        } else if (gating == 2) {
            for (int64_t e = 0; e < E; e++) p[e] = 1.0f / (1.0f + expf(-p[e]));
        }
        for (int64_t e = 0; e < E; e++) q[e] = sel ? p[e] + sel[e] : p[e];
        int64_t *it = ids + t * k;
        float *wt = w + t * k;
        for (int64_t j = 0; j < k; j++) {   /* selection: k passes (k is small: 1-16) */
            int64_t best = -1;
            for (int64_t e = 0; e < E; e++) {
                int taken = 0;
                for (int64_t i = 0; i < j; i++) taken |= it[i] == e;
                if (!taken && (best < 0 || q[e] > q[best])) best = e;
            }
            it[j] = best;
            wt[j] = p[best];
        }
        if (gating == 1) {
            float mx = wt[0], sum = 0.0f;
            for (int64_t j = 0; j < k; j++) { wt[j] = expf(wt[j] - mx); sum += wt[j]; }
            for (int64_t j = 0; j < k; j++) wt[j] = wt[j] / sum;
        }
        if (norm) {
            float sum = 0.0f;
            for (int64_t j = 0; j < k; j++) sum += wt[j];
            sum = sum < 6.103515625e-5f ? 6.103515625e-5f : sum;
            for (int64_t j = 0; j < k; j++) wt[j] = wt[j] / sum;
        }
        if (scale != 1.0f)
            for (int64_t j = 0; j < k; j++) wt[j] *= scale;
    }
    return 0;
}
