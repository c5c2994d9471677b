/* sample_greedy.c: greedy_rows, the one native pass of slotserver/model/sampling/greedy.py (why,
   and when it applies: that module's docstring). Compiled with native.PRELUDE
   (slotserver/runtime/prelude.h) in front. */
#if defined(__AVX2__)
#include <immintrin.h>
#endif
/* Row b: x = logits[b] with biases (ids[o[b] .. o[b+1]), added in turn, in scratch [V]) -> tok[b];
   returns the first row whose maximum is not finite (NaN anywhere, or the max is +-inf), or -1. */
int greedy_rows(const float *logits, float *scratch, const int64_t *o, const int64_t *ids, const float *vals,
                int64_t *tok, int64_t B, int64_t V, int64_t sl) {
    for (int64_t b = 0; b < B; b++) {
        const float *x = logits + b * sl;
        if (o[b + 1] > o[b]) {
            memcpy(scratch, x, V * sizeof(float));
            for (int64_t j = o[b]; j < o[b + 1]; j++) scratch[ids[j]] += vals[j];
            x = scratch;
        }
        float m = -INFINITY; int nan = 0; int64_t i = 0;
#if defined(__AVX512F__)
        __m512 vm = _mm512_set1_ps(-INFINITY); __mmask16 un = 0;
        for (; i + 16 <= V; i += 16) {
            const __m512 v = _mm512_loadu_ps(x + i);
            un |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q); vm = _mm512_max_ps(vm, v);
        }
        m = _mm512_reduce_max_ps(vm); nan = un != 0;
#elif defined(__AVX2__)
        __m256 vm = _mm256_set1_ps(-INFINITY), un = _mm256_setzero_ps();
        for (; i + 8 <= V; i += 8) {
            const __m256 v = _mm256_loadu_ps(x + i);
            un = _mm256_or_ps(un, _mm256_cmp_ps(v, v, _CMP_UNORD_Q)); vm = _mm256_max_ps(vm, v);
        }
        float t[8]; _mm256_storeu_ps(t, vm);
        for (int k = 0; k < 8; k++) m = t[k] > m ? t[k] : m;
        nan = _mm256_movemask_ps(un) != 0;
#endif
        for (; i < V; i++) { if (x[i] != x[i]) nan = 1; else if (x[i] > m) m = x[i]; }
        if (nan || !isfinite(m)) return (int)b;
        int64_t k = 0;
        while (x[k] != m) k++;
        tok[b] = k;
    }
    return -1;
}
