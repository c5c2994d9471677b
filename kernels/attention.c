/* attention.c: the CPU attention kernel of kernels/attention.py and kernels/paged_attention.py.

   Both modules compile this one file (native.c_source), so a flat layout and a paged one holding
   the same element type compute every query row with the same code, in the same order: the same
   floats (issue 32: the paged layouts' torch path had moved SmolLM2's log-probabilities by 0.1-0.2
   against the flat ones). The only difference is where cell c of stream s lives: flat, at
   s * s_s + c * s_c; paged, in page table[s][c / page] at row c % page (page stride s_s, row
   stride s_c). Compiled with native.PRELUDE in front (load_row, prefetch_row, fast_exp, f2bf).

   The row kernel: one work unit per (tile of query rows, kv head): the tile's query group against
   each K/V row read once, online softmax over aligned blocks of cells, float32 math, bf16 or
   float32 in and out. What it saves over SDPA is per-call setup: one call per layer, no mask, no
   gather, no transposes. With `sinks` (gpt-oss: [Hq] logits, NULL for every other model) each
   query vector's final normalisation takes its head's sink into the denominator (sink_inv, in
   attention_amx.c); without, the code path and floats are the ones before sinks existed. */
#include <stdlib.h>
#if defined(__AVX512F__) || defined(__F16C__)
#include <immintrin.h>
#endif
#define GMAX 16
#define RMAX 64  /* query vectors (row, head) per work unit */
#define DMAX 576   /* deepseek2's latent row (rope 64 + latent 512); _attention_native.py's DMAX */
#define BLK 64
/* Cells per block of a head_dim's body: BLK, or 16 past 256 (deepseek2's 576-wide latent row): a
   block's K and V rows as float32 are then 2 x 37 KB, where 64 of them take 2 x 147 KB (6% slower
   over 1500 cells, 20 query heads, 2 cores AVX2; 32 cells: level with 16). Rows past 256 never
   reach AMX (prompt_amx), whose blocks follow BLK. */
#define NB_OF(DIM) ((DIM) > 256 ? 16 : BLK)

#define LANES 16
/* The next block's K/V rows are prefetched in a prefill tile (more than PF_MAX_R query vectors)
   and in a unit that reads many cells; not in a short decode unit. For decode rows (SmolLM2-shaped
   calls: 32 rows, 9 query and 3 KV heads; Zen 5, AVX-512): over 1000 cells from DRAM they help
   (950-975 against 1060-1080 us a call); over 131 cells from DRAM they do not (158-166 against
   154-162 us), and in cache they only cost (76 against 63 us). Prefill tiles keep them: without,
   gemma3-270m's pp128 read 3241-3254 against the previous tree's 3393-3530 tok/s; with, level
   (3186-3643 against 3238-3628, four alternating runs each). */
#define PF_MAX_R 16
#define PF_MIN_CELLS 256
#define DPAD(n) (((n) + LANES - 1) / LANES * LANES)

/* q . k, and the block reductions below, are plain loops: native.FLAGS allow reassociation, so the
   compiler vectorizes them with an order of its own, fixed in the compiled code; every query row
   (decode or prefill, any tile) runs the same code, so a row's result never depends on the batch
   around it. n is a multiple of LANES (rows are zero-padded): one vector shape per head_dim. */
static inline float row_dot(const float *a, const float *b, int64_t n) {
    float dot = 0.0f;
    for (int64_t d = 0; d < n; d++) dot += a[d] * b[d];
    return dot;
}

/* max(m, x[j0..j1)): exact in any order (the scores are finite). Vectors by hand: gcc left the
   loop scalar (the `?:` form is NaN-ordered), ~8% of a SmolLM2 decode call. */
static inline float block_max(const float *x, int64_t j0, int64_t j1, float m) {
    int64_t j = j0;
#if defined(__AVX512F__)
    if (j1 - j0 >= 16) {
        __m512 mv = _mm512_set1_ps(m);
        for (; j + 16 <= j1; j += 16) mv = _mm512_max_ps(mv, _mm512_loadu_ps(x + j));
        m = _mm512_reduce_max_ps(mv);
    }
#endif
    for (; j < j1; j++) m = x[j] > m ? x[j] : m;
    return m;
}

/* sum of x[j0..j1) */
static inline float block_sum(const float *x, int64_t j0, int64_t j1) {
    float sum = 0.0f;
    for (int64_t j = j0; j < j1; j++) sum += x[j];
    return sum;
}

typedef float v16f __attribute__((vector_size(64), aligned(4)));   /* GCC/Clang vectors, any ISA */
typedef int v16i __attribute__((vector_size(64)));
#if defined(__clang__)
#define SHUF(a, b, ...) __builtin_shufflevector(a, b, __VA_ARGS__)
#else
#define SHUF(a, b, ...) __builtin_shuffle(a, b, (v16i){__VA_ARGS__})
#endif

/* The dots of q with 16 consecutive K rows (kb[0..15], nv vectors of 16 floats each): per row a
   vector of partial sums, then a transpose-and-add tree (4 levels of two shuffles and an add per
   pair) leaves lane c = q . kb[c]. Why: a dot per row ends in a horizontal reduction (~8
   instructions) for 4 multiply-adds at head_dim 64; the tree costs ~3 per row. */
#if !defined(__AVX512F__)
typedef float v8f __attribute__((vector_size(32), aligned(4)));
#endif
static inline v16f dot16(const float *q, const float *kb, int64_t stride, int64_t nv) {
    v16f s[16], t[8], u[4], w[2];
    for (int c = 0; c < 16; c++) {
#if !defined(__AVX512F__)
        if (nv > 16) {   /* AVX2, rows past 256 (deepseek2's 576): GCC kept a loop-carried 16-float sum on the
                            stack through 16-byte halves (4 GFLOP/s a call); its two 8-float halves, element-wise
                            the same floats, stay in registers */
            const float *k = kb + c * stride;
            v8f lo = *(const v8f *)q * *(const v8f *)k, hi = *(const v8f *)(q + 8) * *(const v8f *)(k + 8);
            for (int64_t x = 1; x < nv; x++) {
                lo += *(const v8f *)(q + 16 * x) * *(const v8f *)(k + 16 * x);
                hi += *(const v8f *)(q + 16 * x + 8) * *(const v8f *)(k + 16 * x + 8);
            }
            union { v16f v; v8f h[2]; } both = {.h = {lo, hi}};
            s[c] = both.v;
            continue;
        }
#endif
        v16f a = *(const v16f *)q * *(const v16f *)(kb + c * stride);
        for (int64_t x = 1; x < nv; x++) a += *(const v16f *)(q + 16 * x) * *(const v16f *)(kb + c * stride + 16 * x);
        s[c] = a;
    }
    for (int k = 0; k < 8; k++)
        t[k] = SHUF(s[2 * k], s[2 * k + 1], 0, 16, 2, 18, 4, 20, 6, 22, 8, 24, 10, 26, 12, 28, 14, 30)
             + SHUF(s[2 * k], s[2 * k + 1], 1, 17, 3, 19, 5, 21, 7, 23, 9, 25, 11, 27, 13, 29, 15, 31);
    for (int k = 0; k < 4; k++)
        u[k] = SHUF(t[2 * k], t[2 * k + 1], 0, 1, 16, 17, 4, 5, 20, 21, 8, 9, 24, 25, 12, 13, 28, 29)
             + SHUF(t[2 * k], t[2 * k + 1], 2, 3, 18, 19, 6, 7, 22, 23, 10, 11, 26, 27, 14, 15, 30, 31);
    for (int k = 0; k < 2; k++)
        w[k] = SHUF(u[2 * k], u[2 * k + 1], 0, 1, 2, 3, 16, 17, 18, 19, 8, 9, 10, 11, 24, 25, 26, 27)
             + SHUF(u[2 * k], u[2 * k + 1], 4, 5, 6, 7, 20, 21, 22, 23, 12, 13, 14, 15, 28, 29, 30, 31);
    return SHUF(w[0], w[1], 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23)
         + SHUF(w[0], w[1], 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31);
}

/* The V sums' vector: one register wide. A 16-float vector on AVX2 (two registers) made GCC keep
   the sums on the stack through 16-byte halves (store-forwarding stalls): decode attention ran
   2.7x slower than on AVX-512. Element-wise, so the floats are the same either way. */
#if defined(__AVX512F__)
#define VL 16
typedef v16f vacc;
#else
#define VL 8
typedef float vacc __attribute__((vector_size(32), aligned(4)));
#endif

/* av[t] += sum over the block's cells j of p[j] * V[j] (nt vectors from column c). On AVX-512, two
   sums a vector, the even and the odd cells, added at the end: one chain of FMAs per vector waited
   on each FMA's latency (4 cycles a cell at head_dim 64). Every row runs the same code, so a row's
   floats still do not depend on its tile. AVX2 keeps one chain: at head_dim 64 its nt is 8, and two
   sets of 8 would take all 16 registers (not measured). */
#if defined(__AVX512F__)
#define PV_SUMS(av, nt, c)                                                                            \
    {                                                                                                 \
        vacc bv[8];                                                                                   \
        for (int64_t t = 0; t < nt; t++) bv[t] = (vacc){0};                                           \
        int64_t j = j0;                                                                               \
        for (; j + 2 <= j1; j += 2) {                                                                 \
            const float pa = p[j], pb = p[j + 1];                                                     \
            for (int64_t t = 0; t < nt; t++) {                                                        \
                av[t] += pa * *(const vacc *)&vb[j][c + VL * t];                                      \
                bv[t] += pb * *(const vacc *)&vb[j + 1][c + VL * t];                                  \
            }                                                                                         \
        }                                                                                             \
        if (j < j1) for (int64_t t = 0; t < nt; t++) av[t] += p[j] * *(const vacc *)&vb[j][c + VL * t]; \
        for (int64_t t = 0; t < nt; t++) av[t] += bv[t];                                              \
    }
#else
#define PV_SUMS(av, nt, c)                                                                            \
    for (int64_t j = j0; j < j1; j++) {                                                               \
        const float pj = p[j];                                                                        \
        for (int64_t t = 0; t < nt; t++) av[t] += pj * *(const vacc *)&vb[j][c + VL * t];             \
    }
#endif

/* IEEE half -> float: exact for every value (subnormals, inf, NaN); written with integer ops so
   that loops of it vectorize without F16C. */
static inline float half2f(uint16_t h) {
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16, em = h & 0x7FFFu;
    union { uint32_t u; float f; } x;
    if (em >= 0x7C00u) x.u = sign | 0x7F800000u | ((uint32_t)(em & 0x3FFu) << 13);      /* inf, NaN */
    else if (em >= 0x0400u) x.u = sign | ((em << 13) + 0x38000000u);                    /* normal */
    else { x.f = (float)em * 5.9604644775390625e-8f; x.u |= sign; }                     /* subnormal: em * 2^-24 */
    return x.f;
}
/* One K or V row of n elements as float32: kt 0 float32, 1 bf16, 2 float16, 3 int8 times the
   row's float32 scale (q8 layouts: value = q * scale, as their reference dequantizes). */
static inline void load_kv(const void *base, int64_t off, int kt, int64_t n, float *dst, float row_scale) {
    if (kt == 3) {
        const int8_t *p = (const int8_t *)base + off;
        for (int64_t i = 0; i < n; i++) dst[i] = (float)p[i] * row_scale;
        return;
    }
    if (kt != 2) { load_row(base, off, kt, n, dst); return; }
    const uint16_t *p = (const uint16_t *)base + off;
    int64_t i = 0;
#if defined(__AVX512F__)
    for (; i + 16 <= n; i += 16) _mm512_storeu_ps(dst + i, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(p + i))));
#elif defined(__F16C__)
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p + i))));
#endif
    for (; i < n; i++) dst[i] = half2f(p[i]);
}

/* Query rows come in tiles: consecutive rows of one stream at consecutive positions (a prefill
   chunk), at most RMAX / G of them (AMX_R / G prompt rows), all prompt rows or none (`prompt`
   flags, may be NULL); a decode row is a tile of its own. -> number of tiles; start
   [n + 1] gets each tile's first row. */
static int64_t row_tiles(const int64_t *streams, const int64_t *kv_lens, const uint8_t *prompt, int64_t B,
                         int64_t rows_max, int64_t prompt_max, int64_t *start) {
    int64_t n = 0;
    for (int64_t r = 0; r < B; r++)
        if (r == 0 || streams[r] != streams[r - 1] || kv_lens[r] != kv_lens[r - 1] + 1
            || r - start[n - 1] >= (prompt && prompt[r] ? prompt_max : rows_max) || (prompt && prompt[r] != prompt[r - 1]))
            start[n++] = r;
    start[n] = B;
    return n;
}

/* Work unit: (tile of query rows, kv head h) with the G = Hq/Hkv query heads of each row: R =
   rows x G query vectors, so each K/V row is read once for all of them. Query vector i sees cells
   lo[i] .. hi[i]-1 (its row's kv_len, and window). Online softmax over blocks of NB_OF(D) cells aligned
   to multiples of it: every query vector takes the same steps in the same order whatever tile it
   sits in, so prefill rows, decode rows and rows of differently chunked prompts agree bit for bit.
   q: [B, Hq, D] (strides sq_b, sq_h); k, v: [streams, cells, Hkv, D] (strides s*_s, s*_c, s*_h),
   or with a block table [streams, tb_s] pages [n_pages, page, Hkv, D] (CELL);
   the head_dim stride is 1 everywhere; out: contiguous [B, Hq, D]. q and out are float32, or bf16
   (`bf16`); K/V elements are float32, bf16, float16 or int8 with scales (`kt` 0-3; 2: llama.cpp's default cache
   type is f16, half the bytes that decode attention reads at large batches).
   The body is specialised for head_dim 64, 128, 256 and 576 (constant trip counts vectorize fully). */
/* Element offset of cell c of stream s (without the head's): flat, or through the block table
   (page = 1 << page_shift cells). */
#define CELL(s, c, s_s, s_c)                                                                          \
    (table ? (int64_t)table[(s) * tb_s + ((c) >> page_shift)] * (s_s) + ((c) & page_mask) * (s_c)      \
           : (s) * (s_s) + (c) * (s_c))

/* Prompt rows of a tile on AMX (attention_amx.c): each query vector's cell range as the row
   kernel takes it (its row's kv_len, and the window); K/V prepared for the tile's chunk (prep, its
   blocks from cell prep_c0) or NULL. -> 0, nonzero on failure. Without AMX in the build the call
   is never reached (prompt_amx is 0) and stands for -1. */
#ifdef ATTN_AMX
static int prompt_tile(const void *q, const void *k, const void *v, void *out, const int64_t *kv_lens,
                       const int32_t *table, int64_t r0, int64_t R, int64_t s, int64_t h, int64_t G, int64_t Hq,
                       int64_t D, int64_t sq_b, int64_t sq_h, int64_t sk_s, int64_t sk_c, int64_t sk_h, int64_t sv_s,
                       int64_t sv_c, int64_t sv_h, int64_t tb_s, int64_t page_shift, int64_t window, float scale,
                       float softcap, int bf16, int kt, const float *sinks, const uint32_t *prep, int64_t prep_c0) {
    int64_t lo[AMX_R], hi[AMX_R];
    for (int64_t i = 0; i < R; i++) {
        const int64_t L = kv_lens[r0 + i / G];
        hi[i] = L; lo[i] = window > 0 && L > window ? L - window : 0;
    }
    const amx_args a = {R, D, G, Hq, s, h, r0, sq_b, sq_h, sk_s, sk_c, sk_h, sv_s, sv_c, sv_h, tb_s, page_shift,
                        table, bf16, kt, sinks};
    return amx_tile(&a, q, k, v, prep, prep_c0, out, lo, hi, scale, softcap);
}

/* Where tile t's K/V for KV head h were prepared (NULL: nowhere, the tile prepares its own). */
static const uint32_t *prep_at(const amx_prep *p, int64_t t, int64_t h, int64_t D, int64_t *c0) {
    if (!p->mem || p->seg_of[t] < 0) return NULL;
    const amx_seg *g = &p->segs[p->seg_of[t]];
    *c0 = g->c_lo / AB * AB;
    return g->mem + h * g->nblk * amx_block_words(D);
}
#else
#define prompt_tile(...) (-1)
typedef struct { uint32_t *mem; } amx_prep;
#define prep_at(...) NULL
#endif

/* AMX serves prompt rows of bf16 or float16 caches with head_dim a multiple of 32, where the CPU
   variant has it (compiled in) and the OS grants its tile data. */
static int prompt_amx(int kt, int64_t Dim) {
#ifdef ATTN_AMX
    return (kt == 1 || kt == 2) && Dim % 32 == 0 && Dim <= 256 && amx_granted();
#else
    (void)kt; (void)Dim;
    return 0;
#endif
}

#define ATTN_BODY(DIM)                                                                                \
    const int64_t D = (DIM), NB = NB_OF(DIM);                                                         \
    _Pragma("omp parallel for num_threads(n_threads) schedule(static, 1)")                           \
    for (int64_t u = 0; u < n_tiles * Hkv; u++) {                                                     \
        const int64_t t = u / Hkv, h = u % Hkv, r0 = tile[t], R = (tile[t + 1] - r0) * G, s = streams[r0]; \
        if (amx && prompt[r0]) {                       /* prompt rows: attention_amx.c */             \
            int64_t pc0 = 0;                                                                          \
            const uint32_t *pp = prep_at(&prep, t, h, D, &pc0);                                       \
            if (prompt_tile(q, k, v, out, kv_lens, table, r0, R, s, h, G, Hq, D, sq_b, sq_h, sk_s, sk_c, sk_h, \
                            sv_s, sv_c, sv_h, tb_s, page_shift, window, scale, softcap, bf16, kt, sinks, pp, pc0)) \
                failed = 1;                                                                           \
            continue;                                                                                 \
        }                                                                                             \
        float qf[RMAX][DPAD(DIM)], acc[RMAX][DIM], kb[NB_OF(DIM)][DPAD(DIM)], vb[NB_OF(DIM)][DIM], m[RMAX], l[RMAX]; \
        int64_t lo[RMAX], hi[RMAX], c_lo = INT64_MAX, c_hi = 0;                                       \
        for (int64_t j = 0; j < NB; j++) for (int64_t d = D; d < DPAD(D); d++) kb[j][d] = 0.0f;       \
        for (int64_t i = 0; i < R; i++) {              /* i: row r0 + i / G, query head h * G + i % G */ \
            const int64_t r = r0 + i / G, L = kv_lens[r];                                             \
            hi[i] = L; lo[i] = window > 0 && L > window ? L - window : 0;                             \
            c_lo = lo[i] < c_lo ? lo[i] : c_lo; c_hi = L > c_hi ? L : c_hi;                           \
            load_row(q, r * sq_b + (h * G + i % G) * sq_h, bf16, D, qf[i]);                           \
            for (int64_t d = 0; d < D; d++) { qf[i][d] *= scale; acc[i][d] = 0.0f; }                  \
            for (int64_t d = D; d < DPAD(D); d++) qf[i][d] = 0.0f;                                    \
            m[i] = -INFINITY; l[i] = 0.0f;                                                            \
        }                                                                                             \
        const int pf = R > PF_MAX_R || c_hi - c_lo >= PF_MIN_CELLS;                                 \
        for (int64_t c0 = c_lo / NB * NB; c0 < c_hi; c0 += NB) {                                       \
            const int64_t n = c_hi - c0 < NB ? c_hi - c0 : NB, js = c0 < c_lo ? c_lo - c0 : 0;         \
            for (int64_t j = js; j < n; j++) {         /* the block's K/V rows, as float32, once */  \
                const int64_t c = c0 + j;                                                             \
                if (pf && (!table || c + NB < c_hi)) {   /* a table is read only where mapped */     \
                    prefetch_row(k, CELL(s, c + NB, sk_s, sk_c) + h * sk_h, kt != 0, D);            \
                    prefetch_row(v, CELL(s, c + NB, sv_s, sv_c) + h * sv_h, kt != 0, D);            \
                }                                                                                     \
                const int64_t so = kt == 3 ? CELL(s, c, ss_s, ss_c) + h * ss_h : 0;                   \
                load_kv(k, CELL(s, c, sk_s, sk_c) + h * sk_h, kt, D, kb[j], kt == 3 ? ks[so] : 1.0f); \
                load_kv(v, CELL(s, c, sv_s, sv_c) + h * sv_h, kt, D, vb[j], kt == 3 ? vs[so] : 1.0f); \
            }                                                                                         \
            for (int64_t i = 0; i < R; i++) {          /* then each query vector over them */        \
                const int64_t j0 = lo[i] > c0 ? lo[i] - c0 : 0, j1 = hi[i] - c0 < n ? hi[i] - c0 : n; \
                if (j0 >= j1) continue;                                                               \
                float p[NB_OF(DIM)], a[DIM];                                                          \
                /* whole 16-cell groups inside the row's own range by the tree, its edges one dot   \
                   each: a cell's method depends on the row alone, never on the tile around it */    \
                const int64_t g0 = (j0 + 15) / 16 * 16, g1 = j1 / 16 * 16;                           \
                if (g0 < g1) {                                                                        \
                    for (int64_t j = j0; j < g0; j++) p[j] = row_dot(qf[i], kb[j], DPAD(D));          \
                    for (int64_t j = g0; j < g1; j += 16)                                             \
                        *(v16f *)&p[j] = dot16(qf[i], kb[j], DPAD(D), DPAD(D) / 16);                 \
                    for (int64_t j = g1; j < j1; j++) p[j] = row_dot(qf[i], kb[j], DPAD(D));          \
                } else for (int64_t j = j0; j < j1; j++) p[j] = row_dot(qf[i], kb[j], DPAD(D));       \
                if (softcap > 0.0f) for (int64_t j = j0; j < j1; j++) p[j] = softcap * tanhf(p[j] / softcap); \
                const float mx = block_max(p, j0, j1, m[i]);                                          \
                const float corr = fast_exp(m[i] - mx);                                                \
                for (int64_t j = j0; j < j1; j++) p[j] = fast_exp(p[j] - mx);                         \
                l[i] = l[i] * corr + block_sum(p, j0, j1); m[i] = mx;                                  \
                if (D % VL == 0) {  /* VL-float vectors kept in registers, at most 8 at a time */    \
                    for (int64_t c = 0; c < D; c += 8 * VL) {                                         \
                        const int64_t nt = (D - c < 8 * VL ? D - c : 8 * VL) / VL;                    \
                        vacc av[8];                                                                   \
                        for (int64_t t = 0; t < nt; t++) av[t] = *(const vacc *)&acc[i][c + VL * t] * corr; \
                        PV_SUMS(av, nt, c)                                                            \
                        for (int64_t t = 0; t < nt; t++) *(vacc *)&acc[i][c + VL * t] = av[t];        \
                    }                                                                                 \
                } else {                                                                              \
                    for (int64_t d = 0; d < D; d++) a[d] = acc[i][d] * corr;                          \
                    for (int64_t j = j0; j < j1; j++) {                                               \
                        const float pj = p[j];                                                        \
                        for (int64_t d = 0; d < D; d++) a[d] += pj * vb[j][d];                        \
                    }                                                                                 \
                    for (int64_t d = 0; d < D; d++) acc[i][d] = a[d];                                 \
                }                                                                                     \
            }                                                                                         \
        }                                                                                             \
        for (int64_t i = 0; i < R; i++) {                                                             \
            const float inv = sinks ? sink_inv(m[i], l[i], sinks[h * G + i % G]) : 1.0f / l[i];        \
            const int64_t off = ((r0 + i / G) * Hq + h * G + i % G) * D;                              \
            if (bf16) { uint16_t *o = (uint16_t *)out + off; for (int64_t d = 0; d < D; d++) o[d] = f2bf(acc[i][d] * inv); } \
            else { float *o = (float *)out + off; for (int64_t d = 0; d < D; d++) o[d] = acc[i][d] * inv; } \
        }                                                                                             \
    }

/* B query rows (decode rows, or every row of a batch): row r of stream streams[r] sees its first
   kv_lens[r] cells (causal: its position + 1); table NULL: flat K/V, else paged (CELL). -> 0, -1
   for an unsupported group or head_dim, -2 out of memory. */
static int attention_rows(const void *q, const void *k, const void *v, void *out,
                          const int64_t *streams, const int64_t *kv_lens, const uint8_t *prompt, const int32_t *table,
                          const float *ks, const float *vs, const float *sinks,
                          int64_t B, int64_t Hq, int64_t Hkv, int64_t Dim, int64_t sq_b, int64_t sq_h,
                          int64_t sk_s, int64_t sk_c, int64_t sk_h, int64_t sv_s, int64_t sv_c, int64_t sv_h,
                          int64_t ss_s, int64_t ss_c, int64_t ss_h,
                          int64_t tb_s, int64_t page_shift, int64_t window, float scale, float softcap,
                          int bf16, int kt, int n_threads) {
    const int64_t G = Hq / Hkv, page_mask = ((int64_t)1 << page_shift) - 1;
    if (G > GMAX || Dim > DMAX || G * Hkv != Hq) return -1;
    int64_t *tile = malloc((B + 1) * sizeof(int64_t));
    if (!tile) return -2;
    const int amx = prompt && prompt_amx(kt, Dim);
    const int64_t n_tiles = row_tiles(streams, kv_lens, amx ? prompt : NULL, B, RMAX / G, AMX_R / G, tile);
    int failed = 0;
    amx_prep prep = {0};
#ifdef ATTN_AMX
    if (amx) {   /* each prompt chunk's K/V converted for the tiles once (attention_amx_kv.c) */
        const amx_args base = {0, Dim, G, Hq, 0, 0, 0, sq_b, sq_h, sk_s, sk_c, sk_h, sv_s, sv_c, sv_h, tb_s, page_shift,
                               table, bf16, kt, sinks};
        (void)amx_prep_build(&prep, base, k, v, tile, n_tiles, streams, kv_lens, prompt, window, Hkv, n_threads);   /* else none: each tile its own */
    }
#endif
    if (Dim == 64) { ATTN_BODY(64) }
    else if (Dim == 128) { ATTN_BODY(128) }
    else if (Dim == 256) { ATTN_BODY(256) }   /* gemma2/3: the generic body ran ~2 GFLOP/s there */
    else if (Dim == 576) { ATTN_BODY(576) }   /* deepseek2's latent row: K = V, one KV head */
    else { ATTN_BODY(Dim) }
#ifdef ATTN_AMX
    if (amx) amx_prep_free(&prep);
#endif
    free(tile);
    return failed ? -2 : 0;
}

/* Flat K/V [streams, cells, Hkv, D] (any strides); int8 K/V (kt 3) come with float32 scales
   ks, vs [streams, cells, Hkv] of one stride set (ss_*); sinks: [Hq] float32 logits or NULL (see
   sink_inv). Every argument a pointer, shape, stride or constant, so a step graph may replay it
   (native.signature(replay=True); 28 integer-class arguments, step_graph replays up to 28). */
int decode_attention(const void *q, const void *k, const void *v, void *out,
                     const int64_t *streams, const int64_t *kv_lens, const float *ks, const float *vs,
                     const float *sinks,
                     int64_t B, int64_t Hq, int64_t Hkv, int64_t Dim,
                     int64_t sq_b, int64_t sq_h, int64_t sk_s, int64_t sk_c, int64_t sk_h,
                     int64_t sv_s, int64_t sv_c, int64_t sv_h, int64_t ss_s, int64_t ss_c, int64_t ss_h,
                     int64_t window, float scale, float softcap, int bf16, int kt, int n_threads) {
    return attention_rows(q, k, v, out, streams, kv_lens, NULL, NULL, ks, vs, sinks, B, Hq, Hkv, Dim, sq_b, sq_h, sk_s, sk_c,
                          sk_h, sv_s, sv_c, sv_h, ss_s, ss_c, ss_h, 0, 0, window, scale, softcap, bf16, kt, n_threads);
}

/* 1 where prompt rows of an f16/bf16 cache run on AMX tiles in this build and process, else 0
   (the kernels' cpu_path report). */
int attention_prompt_amx(void) { return prompt_amx(2, 64); }

/* decode_attention with `prompt` flags [B] (1: a row of a prompt chunk, which AMX may serve; see
   attention_amx.c). Not replayable: step graphs replay decode steps, which have no prompt rows. */
int prompt_attention(const void *q, const void *k, const void *v, void *out,
                     const int64_t *streams, const int64_t *kv_lens, const uint8_t *prompt, const float *sinks,
                     int64_t B, int64_t Hq, int64_t Hkv, int64_t Dim,
                     int64_t sq_b, int64_t sq_h, int64_t sk_s, int64_t sk_c, int64_t sk_h,
                     int64_t sv_s, int64_t sv_c, int64_t sv_h,
                     int64_t window, float scale, float softcap, int bf16, int kt, int n_threads) {
    return attention_rows(q, k, v, out, streams, kv_lens, prompt, NULL, NULL, NULL, sinks, B, Hq, Hkv, Dim, sq_b, sq_h, sk_s,
                          sk_c, sk_h, sv_s, sv_c, sv_h, 0, 0, 0, 0, 0, window, scale, softcap, bf16, kt, n_threads);
}

/* Paged K/V: pages [n_pages, page, Hkv, D] (page stride s*_s, row stride s*_c, any order inside),
   table [streams, tb_s] int32 page ids, page = 1 << page_shift cells. Not replayable: a paged
   pool grows and shrinks, so its pointers are not constants of the call site. */
int paged_attention_rows(const void *q, const void *k, const void *v, void *out,
                         const int64_t *streams, const int64_t *kv_lens, const uint8_t *prompt, const int32_t *table,
                         const float *sinks,
                         int64_t B, int64_t Hq, int64_t Hkv, int64_t Dim, int64_t sq_b, int64_t sq_h,
                         int64_t sk_s, int64_t sk_c, int64_t sk_h, int64_t sv_s, int64_t sv_c, int64_t sv_h,
                         int64_t tb_s, int64_t page_shift, int64_t window, float scale, float softcap,
                         int bf16, int kt, int n_threads) {
    return attention_rows(q, k, v, out, streams, kv_lens, prompt, table, NULL, NULL, sinks, B, Hq, Hkv, Dim, sq_b, sq_h, sk_s,
                          sk_c, sk_h, sv_s, sv_c, sv_h, 0, 0, 0, tb_s, page_shift, window, scale, softcap, bf16,
                          kt, n_threads);
}
