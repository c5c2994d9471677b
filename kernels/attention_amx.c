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
   Per BLK-cell block of the stream:
     S = Q K^T: A = q rows [16 vectors x 32 dims], B = K^T in pairs (VNNI) [16 dim pairs x 16 cells];
     softmax per vector on S, P = exp(S - max) split hi/lo (zero outside the vector's cells);
     O += P V: A = P [16 vectors x 32 cells], B = V in pairs of cells [16 cell pairs x 16 dims]. */
#define AMX_R 256      /* most query vectors (rows x G) per prompt tile: K/V are prepared once per tile */
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
#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__AVX512F__) && defined(__AVX512BF16__) && defined(__AVX512BW__)
#define ATTN_AMX 1
#define AB 64          /* cells per block, aligned to multiples of AB (as attention.c's BLK) */
#define TAU 8.0f       /* a row's reference max moves only when a block's max passes it by this much */

typedef struct {
    int64_t R, D, G, Hq, s, h, r0, sq_b, sq_h, sk_s, sk_c, sk_h, sv_s, sv_c, sv_h, tb_s, page_shift;
    const int32_t *table;
    int bf16, kt;       /* q/out bf16; K/V type: 1 bf16, 2 float16 (lo parts only for float16) */
    const float *sinks; /* [Hq] sink logits, or NULL (sink_inv) */
} amx_args;

/* One tile's scratch; K^T, V and P twice, for the pipeline in amx_tile. */
typedef struct {
    uint16_t *qh, *ql;              /* [RP][D] q * scale, hi and lo */
    uint32_t *kth[2], *ktl[2];      /* [D/2][AB] K^T: row p holds dims 2p, 2p+1 of each cell */
    uint32_t *vvh[2], *vvl[2];      /* [AB/2][D] V: row p holds cells 2p, 2p+1 of each dim */
    uint16_t *ph[2], *pl[2];        /* [RP][AB] P, zero outside each vector's cells */
    float *sc, *acc;                /* [RP][AB] scores, [RP][D] unnormalised output */
} amx_scratch;

typedef struct { int64_t c0, n, js; } amx_block;   /* cells c0 + [js, n) of the tile's range */

static inline int64_t amx_cell(const amx_args *a, int64_t c, int64_t s_s, int64_t s_c) {
    if (!a->table) return a->s * s_s + c * s_c;
    return (int64_t)a->table[a->s * a->tb_s + (c >> a->page_shift)] * s_s + (c & (((int64_t)1 << a->page_shift) - 1)) * s_c;
}

/* 16 K/V elements as float32: kt 1 bf16, 2 float16. */
static inline __m512 kv16(const void *base, int64_t off, int kt) {
    const __m256i raw = _mm256_loadu_si256((const __m256i *)((const uint16_t *)base + off));
    if (kt == 2) return _mm512_cvtph_ps(raw);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16));
}

static inline __m512 bf16_lo(__m512i h) { return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_castsi512_si256(h)), 16)); }
static inline __m512 bf16_hi(__m512i h) { return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_extracti64x4_epi64(h, 1)), 16)); }

/* x0, x1 (32 floats) -> 32 bf16 hi (round to nearest even), and lo = bf16(x - hi) into *lo. */
static inline __m512i split32(__m512 x0, __m512 x1, __m512i *lo) {
    const __m512i h = (__m512i)_mm512_cvtne2ps_pbh(x1, x0);
    *lo = (__m512i)_mm512_cvtne2ps_pbh(_mm512_sub_ps(x1, bf16_hi(h)), _mm512_sub_ps(x0, bf16_lo(h)));
    return h;
}

/* 16 floats -> bf16 hi and lo, stored. */
static inline void split16(__m512 x, uint16_t *hi, uint16_t *lo) {
    const __m256i h = (__m256i)_mm512_cvtneps_pbh(x);
    _mm256_storeu_si256((__m256i *)hi, h);
    _mm256_storeu_si256((__m256i *)lo, (__m256i)_mm512_cvtneps_pbh(_mm512_sub_ps(x, bf16_lo(_mm512_castsi256_si512(h)))));
}

/* r (16 rows of 16 32-bit words) transposed, row i stored at dst + i * ds (words). */
static inline void transpose16(__m512i r[16], uint32_t *dst, int64_t ds) {
    __m512i t[16];
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
    }
    for (int i = 0; i < 16; i += 4) {
        r[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
        r[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
        r[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
        r[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
    }
    for (int i = 0; i < 4; i++) {   /* rows i, i+4, i+8, i+12 hold the 128-bit quarters of 4 output rows */
        t[i] = _mm512_shuffle_i32x4(r[i], r[i + 4], 0x88);
        t[i + 4] = _mm512_shuffle_i32x4(r[i], r[i + 4], 0xDD);
        t[i + 8] = _mm512_shuffle_i32x4(r[i + 8], r[i + 12], 0x88);
        t[i + 12] = _mm512_shuffle_i32x4(r[i + 8], r[i + 12], 0xDD);
    }
    for (int i = 0; i < 4; i++) {
        _mm512_store_si512(dst + (i + 0) * ds, _mm512_shuffle_i32x4(t[i], t[i + 8], 0x88));
        _mm512_store_si512(dst + (i + 8) * ds, _mm512_shuffle_i32x4(t[i], t[i + 8], 0xDD));
        _mm512_store_si512(dst + (i + 4) * ds, _mm512_shuffle_i32x4(t[i + 4], t[i + 12], 0x88));
        _mm512_store_si512(dst + (i + 12) * ds, _mm512_shuffle_i32x4(t[i + 4], t[i + 12], 0xDD));
    }
}

/* K^T of the block's 16-cell groups that amx_scores reads, cells outside [js, n) zero. */
static void amx_load_k(const amx_args *a, const void *k, amx_block b, uint32_t *kth, uint32_t *ktl) {
    const int64_t D = a->D;
    for (int64_t g = b.js / 16 * 16; g < b.n; g += 16)
        for (int64_t d = 0; d < D; d += 32) {       /* 16 cells x 32 dims -> 16 dim pairs x 16 cells */
            __m512i rh[16], rl[16];
            for (int64_t r = 0; r < 16; r++) {
                const int64_t j = g + r;
                if (j < b.js || j >= b.n) { rh[r] = rl[r] = _mm512_setzero_si512(); continue; }
                const int64_t off = amx_cell(a, b.c0 + j, a->sk_s, a->sk_c) + a->h * a->sk_h + d;
                rh[r] = split32(kv16(k, off, a->kt), kv16(k, off + 16, a->kt), &rl[r]);
            }
            transpose16(rh, kth + d / 2 * AB + g, AB);
            if (a->kt == 2) transpose16(rl, ktl + d / 2 * AB + g, AB);
        }
}

/* V of the block's 32-cell halves that amx_pv reads, in cell pairs; cells outside [js, n) zero. */
static void amx_load_v(const amx_args *a, const void *v, amx_block b, uint32_t *vvh, uint32_t *vvl) {
    const int64_t D = a->D, end = (b.n + 31) / 32 * 32;
    const __m512i pairs = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8,
                                           23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    for (int64_t j = b.js / 32 * 32; j < end; j += 2) {
        const int in0 = j >= b.js && j < b.n, in1 = j + 1 >= b.js && j + 1 < b.n;
        const int64_t o0 = in0 ? amx_cell(a, b.c0 + j, a->sv_s, a->sv_c) + a->h * a->sv_h : 0;
        const int64_t o1 = in1 ? amx_cell(a, b.c0 + j + 1, a->sv_s, a->sv_c) + a->h * a->sv_h : 0;
        for (int64_t d = 0; d < D; d += 16) {       /* [cell j, 16 dims | cell j+1] -> 16 (j, j+1) pairs */
            __m512i lo;
            const __m512 x0 = in0 ? kv16(v, o0 + d, a->kt) : _mm512_setzero_ps();
            const __m512 x1 = in1 ? kv16(v, o1 + d, a->kt) : _mm512_setzero_ps();
            const __m512i hi = split32(x0, x1, &lo);
            _mm512_store_si512(vvh + j / 2 * D + d, _mm512_permutexvar_epi16(pairs, hi));
            if (a->kt == 2) _mm512_store_si512(vvl + j / 2 * D + d, _mm512_permutexvar_epi16(pairs, lo));
        }
    }
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

/* e^x for x <= TAU (x - the row's reference max): fast_exp16's polynomial without its clamp. Lanes
   below float32's range (e^-87) give 0 or a denormal through scalef, never a wrong value; masked
   lanes may hold anything, their results are discarded. */
static inline __m512 exp16(__m512 x) {
    const __m512 t = _mm512_mul_ps(x, _mm512_set1_ps(1.4426950409f));
    const __m512 n = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC), f = _mm512_sub_ps(t, n);
    return _mm512_scalef_ps(EXP2_POLY(_mm512_fmadd_ps, _mm512_set1_ps, f), n);
}

/* Lanes [j0, j1) of the 16 cells from j. */
static inline __mmask16 lanes(int64_t j, int64_t j0, int64_t j1) {
    const uint32_t below1 = j1 - j >= 16 ? 0xFFFFu : j1 > j ? (1u << (j1 - j)) - 1 : 0u;
    const uint32_t below0 = j0 - j >= 16 ? 0xFFFFu : j0 > j ? (1u << (j0 - j)) - 1 : 0u;
    return (__mmask16)(below1 & ~below0);
}
/* The softmax of the block per query vector i < R over its own cells [lo_i, hi_i): P = e^(s - m_i)
   with a reference max m_i that moves (rescaling acc_i and l_i) only when the block's max passes
   it by TAU, so acc, which the tiles read and write, is rarely touched by vector code (each such
   touch stalls the next tile load). P (hi/lo) is written for all AB cells, zero outside. */
static void amx_softmax(const amx_args *a, int64_t R, amx_block b, const int64_t *lo, const int64_t *hi,
                        float softcap, float *m, float *l, uint16_t *ph, uint16_t *pl, amx_scratch *w) {
    const int64_t D = a->D;
    for (int64_t i = 0; i < R; i++) {
        float *s = w->sc + i * AB;
        uint16_t *h = ph + i * AB, *o = pl + i * AB;
        const int64_t j0 = lo[i] > b.c0 ? lo[i] - b.c0 : 0, j1 = hi[i] - b.c0 < b.n ? hi[i] - b.c0 : b.n;
        if (j0 >= j1) {
            for (int64_t j = 0; j < AB; j += 32) { _mm512_store_si512(h + j, _mm512_setzero_si512()); _mm512_store_si512(o + j, _mm512_setzero_si512()); }
            continue;
        }
        if (softcap > 0.0f) for (int64_t j = j0; j < j1; j++) s[j] = softcap * tanhf(s[j] / softcap);
        __m512 sv[AB / 16], mxv = _mm512_set1_ps(-INFINITY);
        __mmask16 in[AB / 16];
        for (int64_t c = 0; c < AB / 16; c++) {
            in[c] = lanes(16 * c, j0, j1);
            sv[c] = _mm512_load_ps(s + 16 * c);
            mxv = _mm512_mask_max_ps(mxv, in[c], mxv, sv[c]);
        }
        const float mx = _mm512_reduce_max_ps(mxv);
        if (m[i] == -INFINITY) m[i] = mx;          /* acc and l are still zero */
        else if (mx > m[i] + TAU) {
            const float corr = fast_exp(m[i] - mx);
            float *acc = w->acc + i * D;
            for (int64_t d = 0; d < D; d += 16) _mm512_store_ps(acc + d, _mm512_mul_ps(_mm512_load_ps(acc + d), _mm512_set1_ps(corr)));
            l[i] *= corr; m[i] = mx;
        }
        __m512 sum = _mm512_setzero_ps();
        for (int64_t c = 0; c < AB / 16; c += 2) {   /* lanes outside [j0, j1) are exact zeros */
            const __m512 e0 = _mm512_maskz_mov_ps(in[c], exp16(_mm512_sub_ps(sv[c], _mm512_set1_ps(m[i]))));
            const __m512 e1 = _mm512_maskz_mov_ps(in[c + 1], exp16(_mm512_sub_ps(sv[c + 1], _mm512_set1_ps(m[i]))));
            sum = _mm512_add_ps(_mm512_add_ps(sum, e0), e1);
            const __m512 h0 = _mm512_and_ps(e0, HI_MASK), h1 = _mm512_and_ps(e1, HI_MASK);   /* exact bf16 */
            _mm512_store_si512(h + 16 * c, (__m512i)_mm512_cvtne2ps_pbh(h1, h0));
            _mm512_store_si512(o + 16 * c, (__m512i)_mm512_cvtne2ps_pbh(_mm512_sub_ps(e1, h1), _mm512_sub_ps(e0, h0)));
        }
        l[i] += _mm512_reduce_add_ps(sum);
    }
}

static void *amx_alloc(amx_scratch *w, int64_t RP, int64_t D) {
    const int64_t q = RP * D * 2, kt = D / 2 * AB * 4, vv = AB / 2 * D * 4, p = RP * AB * 2;
    const int64_t sizes[] = {q, q, kt, kt, kt, kt, vv, vv, vv, vv, p, p, p, p, RP * AB * 4, RP * D * 4};
    void **slots[] = {(void **)&w->qh, (void **)&w->ql, (void **)&w->kth[0], (void **)&w->kth[1], (void **)&w->ktl[0],
                      (void **)&w->ktl[1], (void **)&w->vvh[0], (void **)&w->vvh[1], (void **)&w->vvl[0],
                      (void **)&w->vvl[1], (void **)&w->ph[0], (void **)&w->ph[1], (void **)&w->pl[0],
                      (void **)&w->pl[1], (void **)&w->sc, (void **)&w->acc};
    int64_t total = 0;
    for (int i = 0; i < 16; i++) total += (sizes[i] + 63) / 64 * 64;
    char *base = aligned_alloc(64, total), *at = base;
    if (!base) return NULL;
    memset(base, 0, total);
    for (int i = 0; i < 16; i++) { *slots[i] = at; at += (sizes[i] + 63) / 64 * 64; }
    return base;
}

static amx_block amx_block_at(int64_t c0, int64_t c_lo, int64_t c_hi) {
    const amx_block b = {c0, c_hi - c0 < AB ? c_hi - c0 : AB, c0 < c_lo ? c_lo - c0 : 0};
    return b;
}

/* One tile: query vectors i < R <= AMX_R (row r0 + i / G, head h G + i % G) of stream s against
   KV head h; vector i sees cells [lo[i], hi[i]). q, k, v, out as in attention.c. -> 0, -2 out
   of memory. Pipelined so that no tile load reads bytes that vector stores wrote just before
   (it would wait for them: ~3x the tile products' time): K^T is prepared a block ahead, and
   block b's P V runs after block b+1's scores and V. */
static int amx_tile(const amx_args *a, const void *q, const void *k, const void *v, void *out, const int64_t *lo,
                    const int64_t *hi, float scale, float softcap) {
    const int64_t R = a->R, D = a->D, G = a->G, RP = (R + 15) / 16 * 16;
    amx_scratch w;
    void *mem = amx_alloc(&w, RP, D);
    if (!mem) return -2;
    float m[AMX_R], l[AMX_R], qf[256];
    int64_t c_lo = INT64_MAX, c_hi = 0;
    for (int64_t i = 0; i < R; i++) {
        load_row(q, (a->r0 + i / G) * a->sq_b + (a->h * G + i % G) * a->sq_h, a->bf16, D, qf);
        for (int64_t d = 0; d < D; d += 16)
            split16(_mm512_mul_ps(_mm512_loadu_ps(qf + d), _mm512_set1_ps(scale)), w.qh + i * D + d, w.ql + i * D + d);
        m[i] = -INFINITY; l[i] = 0.0f;
        c_lo = lo[i] < c_lo ? lo[i] : c_lo; c_hi = hi[i] > c_hi ? hi[i] : c_hi;
    }
    tile_config cfg = {0};
    cfg.palette = 1;
    for (int t = 0; t < 7; t++) { cfg.rows[t] = 16; cfg.colsb[t] = 64; }
    _tile_loadconfig(&cfg);
    const int64_t first = c_lo / AB * AB;
    amx_block prev = {0, 0, 0};
    amx_load_k(a, k, amx_block_at(first, c_lo, c_hi), w.kth[0], w.ktl[0]);
    for (int64_t c0 = first, x = 0; c0 < c_hi; c0 += AB, x ^= 1) {
        const amx_block b = amx_block_at(c0, c_lo, c_hi);
        if (c0 + AB < c_hi) amx_load_k(a, k, amx_block_at(c0 + AB, c_lo, c_hi), w.kth[x ^ 1], w.ktl[x ^ 1]);
        amx_scores(a, RP, b, w.kth[x], w.ktl[x], &w);
        amx_load_v(a, v, b, w.vvh[x], w.vvl[x]);
        if (c0 > first) amx_pv(a, RP, prev, w.ph[x ^ 1], w.pl[x ^ 1], w.vvh[x ^ 1], w.vvl[x ^ 1], &w);
        amx_softmax(a, R, b, lo, hi, softcap, m, l, w.ph[x], w.pl[x], &w);
        prev = b;
    }
    const int64_t x = ((c_hi - 1) / AB - first / AB) & 1;   /* the last block's buffers */
    amx_pv(a, RP, prev, w.ph[x], w.pl[x], w.vvh[x], w.vvl[x], &w);
    _tile_release();
    for (int64_t i = 0; i < R; i++) {
        const float inv = a->sinks ? sink_inv(m[i], l[i], a->sinks[a->h * G + i % G]) : 1.0f / l[i];
        const int64_t off = ((a->r0 + i / G) * a->Hq + a->h * G + i % G) * D;
        for (int64_t d = 0; d < D; d++) st(out, off + d, a->bf16, w.acc[i * D + d] * inv);
    }
    free(mem);
    return 0;
}
#endif
