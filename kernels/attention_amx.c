/* attention_amx.c: prompt rows on AMX tiles (compiled in front of attention.c, which calls amx_tile).

   Why: a prompt chunk's attention is a small GEMM per KV head, q [rows x G, D] against the K/V of
   its stream, and the float32 row kernel spends ~13 cycles per (query vector, cell) on it: in an
   agent loop, the new turn's ~600 rows over a 5k-token history cost more than all its matmuls.
   AMX multiplies bf16 tiles at 512 MACs a cycle. Its inputs are bf16, so every float32 operand x is
   split as x = hi + lo, two bf16 (16 significant bits; an f16 K/V element is exactly hi + lo), and
   a product a.b is taken as hi.hi + hi.lo + lo.hi: about float32's accuracy for the scores and the
   sums, not bf16's (a bf16 cache has lo = 0, and those products are skipped).

   Batch invariance: a query vector's result depends on its own q, its own cell range and the K/V
   alone, never on the other vectors of its tile. The cell blocks are aligned to multiples of BLK,
   each output element of a tile product reads only its own row of A and column of B, P is exactly
   zero outside the vector's range (so the cells another vector needs add exact zeros), and the
   softmax runs per vector in a fixed order. So a prompt gives the same floats however it was
   chunked or batched. It does not give the float32 row kernel's floats: attention.c uses this
   path for prompt rows only (`prompt` flags), and decode and speculative-verify rows stay on the
   row kernel, where they agree with each other bit for bit.

   Tiles (palette 1, each 16 rows x 64 bytes): 0 the accumulator C, 1-4 A, 5-6 B (amx_load_a).
   K/V come converted to bf16 hi/lo in the tiles' layouts, once per prompt chunk and call
   (attention_amx_kv.c). Per BLK-cell block of the stream:
     S = Q K^T: A = q rows [16 vectors x 32 dims], B = K^T in pairs (VNNI) [16 dim pairs x 16 cells];
     softmax per vector on S, P = exp(S - max) split hi/lo (zero outside the vector's cells);
     O += P V: A = P [16 vectors x 32 cells], B = V in pairs of cells [16 cell pairs x 16 dims]. */
#define AMX_R 256      /* most query vectors (rows x G) per prompt tile (K/V: attention_amx_kv.c) */
#include <math.h>

/* 1 / the softmax denominator of a query vector whose scores have running max m and sum l (its
   accumulator relative to m), with a sink: a learned logit joining the denominator with no value
   (gpt-oss; ggml_soft_max_ext's sinks, whose max includes the sink). M = max(m, sink):
   out = acc e^(m-M) / (l e^(m-M) + e^(sink-M)). Used by attention.c's row kernel and amx_tile,
   only where a layer has sinks (its callers keep 1 / l otherwise: the same floats as before). */
static inline float sink_inv(float m, float l, float sink) {
    const float mx = m > sink ? m : sink, e = expf(m - mx);
    return e / (l * e + expf(sink - mx));
}
#ifdef ATTN_AMX
#define TAU 8.0f       /* a row's reference max moves only when a block's max passes it by this much */

/* One tile's scratch; P twice, for the pipeline in amx_tile. */
typedef struct {
    uint16_t *qh, *ql;              /* [RP][D] q * scale, hi and lo */
    uint16_t *ph[2], *pl[2];        /* [RP][AB] P, zero outside each vector's cells */
    float *sc, *acc, *lv;           /* [RP][AB] scores, [RP][D] unnormalised output, [RP][16] sums */
} amx_scratch;

/* 16 floats -> bf16 hi and lo, stored. */
static inline void split16(__m512 x, uint16_t *hi, uint16_t *lo) {
    const __m256i h = (__m256i)_mm512_cvtneps_pbh(x);
    _mm256_storeu_si256((__m256i *)hi, h);
    _mm256_storeu_si256((__m256i *)lo, (__m256i)_mm512_cvtneps_pbh(_mm512_sub_ps(x, bf16_lo(_mm512_castsi256_si512(h)))));
}

/* Tiles: 0 the accumulator C; 1-4 the A operands kept across the inner loop (hi, lo for two
   32-wide steps of the contraction); 5-6 the B operand (hi, lo). */
static inline void amx_load_a(int64_t steps, const void *hi, const void *lo, int64_t step, int64_t stride) {
    _tile_loadd(1, hi, stride); _tile_loadd(2, lo, stride);
    if (steps > 1) { _tile_loadd(3, (const char *)hi + step, stride); _tile_loadd(4, (const char *)lo + step, stride); }
}

/* C += A.B for contraction step x of the A tiles loaded: hi.hi, hi.lo (when B has a lo), lo.hi. */
#define AMX_DOT3(x, b_hi, b_lo, sb)                                                                    \
    do {                                                                                              \
        _tile_loadd(5, b_hi, sb);                                                                     \
        if (x == 0) { _tile_dpbf16ps(0, 1, 5); } else { _tile_dpbf16ps(0, 3, 5); }                     \
        if (b_lo) {                                                                                   \
            _tile_loadd(6, b_lo, sb);                                                                 \
            if (x == 0) { _tile_dpbf16ps(0, 1, 6); } else { _tile_dpbf16ps(0, 3, 6); }                 \
        }                                                                                             \
        if (x == 0) { _tile_dpbf16ps(0, 2, 5); } else { _tile_dpbf16ps(0, 4, 5); }                     \
    } while (0)

/* sc[i][j] = q_i . k_j (q pre-scaled) for the block's 16-cell groups in [js, n): per 16 vectors
   and 64 dims, their q tiles loaded once for every group; a longer head_dim adds its 64-dim
   parts into the stored scores (the same order for every vector). */
static void amx_scores(const amx_args *a, int64_t RP, amx_block b, const uint32_t *kth, const uint32_t *ktl,
                       amx_scratch *w) {
    const int64_t D = a->D, f16 = a->kt == 2;
    for (int64_t t = 0; t < RP; t += 16)
        for (int64_t d0 = 0; d0 < D; d0 += 64) {
            const int64_t steps = D - d0 >= 64 ? 2 : 1;
            amx_load_a(steps, w->qh + t * D + d0, w->ql + t * D + d0, 64, D * 2);
            for (int64_t g = b.js / 16 * 16; g < b.n; g += 16) {
                if (d0 == 0) _tile_zero(0); else _tile_loadd(0, w->sc + t * AB + g, AB * 4);
                for (int64_t x = 0; x < steps; x++) {
                    const int64_t r = (d0 + 32 * x) / 2 * AB + g;
                    AMX_DOT3(x, kth + r, f16 ? ktl + r : NULL, AB * 4);
                }
                _tile_stored(0, w->sc + t * AB + g, AB * 4);
            }
        }
}

/* acc += P V over the block's 32-cell halves in [js, n): per 16 vectors, their P tiles loaded once
   for every 16 dims (the two halves; a block that starts at cell 32 has one). */
static void amx_pv(const amx_args *a, int64_t RP, amx_block b, const uint16_t *ph, const uint16_t *pl,
                   const uint32_t *vvh, const uint32_t *vvl, amx_scratch *w) {
    const int64_t D = a->D, f16 = a->kt == 2, c0 = b.js / 32 * 32, steps = (b.n - c0 + 31) / 32;
    for (int64_t t = 0; t < RP; t += 16) {
        amx_load_a(steps, ph + t * AB + c0, pl + t * AB + c0, 64, AB * 2);
        for (int64_t d = 0; d < D; d += 16) {
            _tile_loadd(0, w->acc + t * D + d, D * 4);
            for (int64_t x = 0; x < steps; x++) {
                const int64_t r = (c0 + 32 * x) / 2 * D + d;
                AMX_DOT3(x, vvh + r, f16 ? vvl + r : NULL, D * 4);
            }
            _tile_stored(0, w->acc + t * D + d, D * 4);
        }
    }
}

/* P's split: hi = x with its low 16 bits cleared (a bf16 value exactly; lo = x - hi is exact in
   float32 and has 16 significant bits at most, rounded to bf16's 8 on conversion). */
#define HI_MASK _mm512_castsi512_ps(_mm512_set1_epi32((int)0xFFFF0000u))

/* e^(s - m) for 16 scores s, given ml = m log2(e): 2^t with t = s log2(e) - ml (one FMA; ml's own
   rounding is a factor common to all the vector's cells, which its normalisation cancels), as
   p(f) 2^floor(t), f = t - floor(t) in [0, 1) (vreduceps) and p a degree-5 fit of 2^f (relative
   error 1.7e-7 in float32; scalef applies the power of two). For t <= TAU log2(e); lanes below
   float32's range give 0 or a denormal, masked lanes may hold anything (their results are
   discarded). 8 vector operations, against 11 for fast_exp16's form. */
static inline __m512 exp16(__m512 s, __m512 ml) {
    const __m512 t = _mm512_fmsub_ps(s, _mm512_set1_ps(1.4426950409f), ml);
    const __m512 f = _mm512_reduce_ps(t, 0x09);   /* round down, no precision exception: t - floor(t) */
    __m512 p = _mm512_fmadd_ps(_mm512_set1_ps(1.8775767e-3f), f, _mm512_set1_ps(8.9893406e-3f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.5826318e-2f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.4015361e-1f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.9315308e-1f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.9999994e-1f));
    return _mm512_scalef_ps(p, t);
}

/* Lanes [j0, j1) of the 16 cells from j. */
static inline __mmask16 lanes(int64_t j, int64_t j0, int64_t j1) {
    const uint32_t below1 = j1 - j >= 16 ? 0xFFFFu : j1 > j ? (1u << (j1 - j)) - 1 : 0u;
    const uint32_t below0 = j0 - j >= 16 ? 0xFFFFu : j0 > j ? (1u << (j0 - j)) - 1 : 0u;
    return (__mmask16)(below1 & ~below0);
}

/* Query vector i's max against its reference m (the block's scores sv in lanes `in`): m moves
   (rescaling acc_i and the sums lv_i) only when the block's max passes it by TAU, so acc, which
   the tiles read and write, is rarely touched by vector code (each such touch stalls the next
   tile load). The test is one compare of the lanes' max vector; the reduction runs only then. */
static inline void amx_max(const __m512 *sv, const __mmask16 *in, int64_t D, float *m, float *acc, float *lv) {
    __m512 mxv = _mm512_set1_ps(-INFINITY);
    for (int64_t c = 0; c < AB / 16; c++) mxv = _mm512_mask_max_ps(mxv, in[c], mxv, sv[c]);
    if (!_mm512_cmp_ps_mask(mxv, _mm512_set1_ps(*m + TAU), _CMP_GT_OQ)) return;
    const float mx = _mm512_reduce_max_ps(mxv);
    if (*m != -INFINITY) {                         /* else acc and the sums are still zero */
        const __m512 corr = _mm512_set1_ps(fast_exp(*m - mx));
        for (int64_t d = 0; d < D; d += 16) _mm512_store_ps(acc + d, _mm512_mul_ps(_mm512_load_ps(acc + d), corr));
        _mm512_store_ps(lv, _mm512_mul_ps(_mm512_load_ps(lv), corr));
    }
    *m = mx;
}

/* The softmax of the block per query vector i < R over its own cells [lo_i, hi_i): P = e^(s - m_i)
   (amx_max), written hi/lo for all AB cells, zero outside; the sums stay 16 lanes wide per vector
   (lv, reduced once at the end). A block wholly inside the vector's range skips the lane masks. */
static void amx_softmax(const amx_args *a, int64_t R, amx_block b, const int64_t *lo, const int64_t *hi,
                        float softcap, float *m, uint16_t *ph, uint16_t *pl, amx_scratch *w, const char *next) {
    const int64_t D = a->D, lines = amx_block_words(D) / 16;
    for (int64_t i = 0; i < R; i++) {
        if (next) for (int64_t x = i * lines / R; x < (i + 1) * lines / R; x++) _mm_prefetch(next + 64 * x, _MM_HINT_T0);
        float *s = w->sc + i * AB;
        uint16_t *h = ph + i * AB, *o = pl + i * AB;
        const int64_t j0 = lo[i] > b.c0 ? lo[i] - b.c0 : 0, j1 = hi[i] - b.c0 < b.n ? hi[i] - b.c0 : b.n;
        if (j0 >= j1) {
            for (int64_t j = 0; j < AB; j += 32) { _mm512_store_si512(h + j, _mm512_setzero_si512()); _mm512_store_si512(o + j, _mm512_setzero_si512()); }
            continue;
        }
        if (softcap > 0.0f) for (int64_t j = j0; j < j1; j++) s[j] = softcap * tanhf(s[j] / softcap);
        const int full = j0 == 0 && j1 == AB;
        __m512 sv[AB / 16];
        __mmask16 in[AB / 16];
        for (int64_t c = 0; c < AB / 16; c++) { in[c] = full ? 0xFFFF : lanes(16 * c, j0, j1); sv[c] = _mm512_load_ps(s + 16 * c); }
        amx_max(sv, in, D, &m[i], w->acc + i * D, w->lv + i * 16);
        const __m512 ml = _mm512_set1_ps(m[i] * 1.4426950409f);
        __m512 sum = _mm512_load_ps(w->lv + i * 16);
        for (int64_t c = 0; c < AB / 16; c += 2) {   /* lanes outside [j0, j1) are exact zeros */
            __m512 e0 = exp16(sv[c], ml), e1 = exp16(sv[c + 1], ml);
            if (!full) { e0 = _mm512_maskz_mov_ps(in[c], e0); e1 = _mm512_maskz_mov_ps(in[c + 1], e1); }
            sum = _mm512_add_ps(_mm512_add_ps(sum, e0), e1);
            const __m512 h0 = _mm512_and_ps(e0, HI_MASK), h1 = _mm512_and_ps(e1, HI_MASK);   /* exact bf16 */
            _mm512_store_si512(h + 16 * c, (__m512i)_mm512_cvtne2ps_pbh(h1, h0));
            _mm512_store_si512(o + 16 * c, (__m512i)_mm512_cvtne2ps_pbh(_mm512_sub_ps(e1, h1), _mm512_sub_ps(e0, h0)));
        }
        _mm512_store_ps(w->lv + i * 16, sum);
    }
}

static void *amx_alloc(amx_scratch *w, int64_t RP, int64_t D) {
    const int64_t q = RP * D * 2, p = RP * AB * 2;
    const int64_t sizes[] = {q, q, p, p, p, p, RP * AB * 4, RP * D * 4, RP * 16 * 4};
    void **slots[] = {(void **)&w->qh, (void **)&w->ql, (void **)&w->ph[0], (void **)&w->ph[1], (void **)&w->pl[0],
                      (void **)&w->pl[1], (void **)&w->sc, (void **)&w->acc, (void **)&w->lv};
    int64_t total = 0;
    for (int i = 0; i < 9; i++) total += (sizes[i] + 63) / 64 * 64;
    char *base = amx_get(0, total), *at = base;
    if (!base) return NULL;
    memset(base, 0, total);
    for (int i = 0; i < 9; i++) { *slots[i] = at; at += (sizes[i] + 63) / 64 * 64; }
    return base;
}

/* The tile's q rows, pre-scaled and split, into w; the union of their ranges -> *c_lo, *c_hi. */
static void amx_load_q(const amx_args *a, const void *q, const int64_t *lo, const int64_t *hi, float scale,
                       amx_scratch *w, float *m, int64_t *c_lo, int64_t *c_hi) {
    const int64_t D = a->D, G = a->G;
    float qf[256];
    *c_lo = INT64_MAX; *c_hi = 0;
    for (int64_t i = 0; i < a->R; i++) {
        load_row(q, (a->r0 + i / G) * a->sq_b + (a->h * G + i % G) * a->sq_h, a->bf16, D, qf);
        for (int64_t d = 0; d < D; d += 16)
            split16(_mm512_mul_ps(_mm512_loadu_ps(qf + d), _mm512_set1_ps(scale)), w->qh + i * D + d, w->ql + i * D + d);
        m[i] = -INFINITY;
        *c_lo = lo[i] < *c_lo ? lo[i] : *c_lo; *c_hi = hi[i] > *c_hi ? hi[i] : *c_hi;
    }
}

/* One tile: query vectors i < R <= AMX_R (row r0 + i / G, head h G + i % G) of stream s against
   KV head h; vector i sees cells [lo[i], hi[i]). K/V come prepared (attention_amx_kv.c: prep holds
   the blocks from cell prep_c0 on), or prep is NULL and the tile prepares its own range. q, out as
   in attention.c. -> 0, -2 out of memory. Block b's P V runs after block b+1's scores, so that no
   tile load reads bytes that vector stores wrote just before (it would wait for them: ~3x the
   tile products' time). */
static int amx_tile(const amx_args *a, const void *q, const void *k, const void *v, const uint32_t *prep,
                    int64_t prep_c0, void *out, const int64_t *lo, const int64_t *hi, float scale, float softcap) {
    const int64_t R = a->R, D = a->D, G = a->G, RP = (R + 15) / 16 * 16, bw = amx_block_words(D), hw = D * AB / 2;
    amx_scratch w;
    void *mem = amx_alloc(&w, RP, D), *own = NULL;
    if (!mem) return -2;
    float m[AMX_R];
    int64_t c_lo, c_hi;
    amx_load_q(a, q, lo, hi, scale, &w, m, &c_lo, &c_hi);
    const int64_t first = c_lo / AB * AB;
    if (!prep) {
        const int64_t nblk = (c_hi - first + AB - 1) / AB;
        if (!(own = aligned_alloc(64, nblk * bw * 4))) { amx_put(0); return -2; }
        amx_prepare(a, k, v, c_lo, c_hi, 0, nblk, own);
        prep = own; prep_c0 = first;
    }
    tile_config cfg = {0};
    cfg.palette = 1;
    for (int t = 0; t < 7; t++) { cfg.rows[t] = 16; cfg.colsb[t] = 64; }
    _tile_loadconfig(&cfg);
    amx_block prev = {0, 0, 0};
    const uint32_t *pb = NULL;
    for (int64_t c0 = first, x = 0; c0 < c_hi; c0 += AB, x ^= 1) {
        const amx_block b = amx_block_at(c0, c_lo, c_hi);
        const uint32_t *kb = prep + (c0 - prep_c0) / AB * bw;
        amx_scores(a, RP, b, kb, kb + hw, &w);
        if (pb) amx_pv(a, RP, prev, w.ph[x ^ 1], w.pl[x ^ 1], pb + 2 * hw, pb + 3 * hw, &w);
        amx_softmax(a, R, b, lo, hi, softcap, m, w.ph[x], w.pl[x], &w,
                    c0 + AB < c_hi ? (const char *)(kb + bw) : NULL);   /* the next block's K/V: from L2/L3 */
        prev = b; pb = kb;
    }
    const int64_t x = ((c_hi - 1) / AB - first / AB) & 1;   /* the last block's buffers */
    amx_pv(a, RP, prev, w.ph[x], w.pl[x], pb + 2 * hw, pb + 3 * hw, &w);
    _tile_release();
    for (int64_t i = 0; i < R; i++) {
        const float l = _mm512_reduce_add_ps(_mm512_load_ps(w.lv + i * 16));
        const float inv = a->sinks ? sink_inv(m[i], l, a->sinks[a->h * G + i % G]) : 1.0f / l;
        const int64_t off = ((a->r0 + i / G) * a->Hq + a->h * G + i % G) * D;
        for (int64_t d = 0; d < D; d++) st(out, off + d, a->bf16, w.acc[i * D + d] * inv);
    }
    free(own);
    amx_put(0);
    return 0;
}
#endif
