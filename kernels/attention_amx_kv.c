/* attention_amx_kv.c: K and V as the AMX tiles of attention_amx.c read them (compiled in front of it).

   The tiles multiply bf16, so each K/V element x is split as x = hi + lo, two bf16 (an f16 element
   exactly; a bf16 cache has lo = 0, not stored), in the layouts the tile products take: K^T in dim
   pairs (row p of a block holds dims 2p, 2p+1 of each cell) and V in cell pairs (row p holds cells
   2p, 2p+1 of each dim). A block is AB cells aligned to multiples of AB.

   Why a pass of its own (issue 37, fourth round): when each tile of <= 256 query vectors converted
   the blocks it read, the conversion cost ~0.5 cycles per (query vector, cell), and a 600-row chunk
   of SmolLM2 (1800 query vectors per KV head) converted every block of its history 7 times. Now a
   call converts each prompt chunk's blocks once per KV head (`amx_prep_build`, in parallel), and
   every tile of the chunk reads them. The floats do not change: a tile reads the cells of its own
   range, and the cells of the chunk's range outside it (zero before, K/V now) meet probabilities
   that are exactly zero; every cell of a chunk's range was written (it is some row's cell), so
   finite. Memory: 8 bytes per (cell, KV head, dim) for an f16 cache, freed at the call's end;
   past AMX_PREP_MAX a call falls back to each tile preparing its own blocks (same floats). */
#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__AVX512F__) && defined(__AVX512BF16__) && defined(__AVX512BW__)
#define ATTN_AMX 1
#define AB 64                          /* cells per block, aligned to multiples of AB (as attention.c's BLK) */
#define AMX_PREP_MAX ((int64_t)1 << 30) /* bytes of prepared K/V a call may hold at once */

/* Buffers a thread keeps between calls (0: a tile's scratch, 1: a call's prepared K/V), up to
   AMX_KEEP bytes each. Why: fresh multi-megabyte buffers per call are fresh pages, and their first
   touch faulted ~900 times a call (a 600-row chunk over 4500 cells: ~1-2 ms of its ~24). */
#define AMX_KEEP ((size_t)64 << 20)
typedef struct { void *p; size_t n; } amx_buf;
static __thread amx_buf amx_kept[2];

/* n bytes, 64-aligned, from the thread's slot (grown when short); amx_put after use. */
static void *amx_get(int slot, size_t n) {
    amx_buf *b = &amx_kept[slot];
    if (b->n >= n) return b->p;
    free(b->p);
    b->p = aligned_alloc(64, (n + 63) / 64 * 64);
    b->n = b->p ? n : 0;
    return b->p;
}

static void amx_put(int slot) {
    amx_buf *b = &amx_kept[slot];
    if (b->n > AMX_KEEP) { free(b->p); b->p = NULL; b->n = 0; }
}

typedef struct {
    int64_t R, D, G, Hq, s, h, r0, sq_b, sq_h, sk_s, sk_c, sk_h, sv_s, sv_c, sv_h, tb_s, page_shift;
    const int32_t *table;
    int bf16, kt;       /* q/out bf16; K/V type: 1 bf16, 2 float16 (lo parts only for float16) */
    const float *sinks; /* [Hq] sink logits, or NULL (sink_inv) */
} amx_args;

typedef struct { int64_t c0, n, js; } amx_block;   /* cells c0 + [js, n) of a range */

static amx_block amx_block_at(int64_t c0, int64_t c_lo, int64_t c_hi) {
    const amx_block b = {c0, c_hi - c0 < AB ? c_hi - c0 : AB, c0 < c_lo ? c_lo - c0 : 0};
    return b;
}

/* 32-bit words of one prepared block: K^T hi, K^T lo, V hi, V lo, D * AB / 2 words each. */
static inline int64_t amx_block_words(int64_t D) { return 2 * D * AB; }

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

/* K^T of the block's 16-cell groups that hold cells of [js, n), cells outside it zero. */
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

/* V of the block's 32-cell halves that hold cells of [js, n), in cell pairs; cells outside it zero. */
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

/* The blocks of cells [c_lo, c_hi) of stream a->s, KV head a->h, from the block at c_lo / AB * AB,
   into dst (amx_block_words(D) words each). */
static void amx_prepare(const amx_args *a, const void *k, const void *v, int64_t c_lo, int64_t c_hi,
                        int64_t blk0, int64_t blk1, uint32_t *dst) {
    const int64_t w = a->D * AB / 2;
    for (int64_t x = blk0; x < blk1; x++, dst += 4 * w) {
        const amx_block b = amx_block_at(c_lo / AB * AB + x * AB, c_lo, c_hi);
        amx_load_k(a, k, b, dst, dst + w);
        amx_load_v(a, v, b, dst + 2 * w, dst + 3 * w);
    }
}

/* A prompt chunk's cells [c_lo, c_hi) of stream s (the union of its rows' ranges), prepared per KV
   head h at mem + h * nblk * amx_block_words(D). */
typedef struct { int64_t s, c_lo, c_hi, nblk; uint32_t *mem; } amx_seg;
typedef struct { amx_seg *segs; int64_t *seg_of, n; uint32_t *mem; } amx_prep;   /* seg_of: [tiles], -1 off AMX */

/* Tiles of the same chunk (one stream, consecutive positions) share a segment. -> segments. */
static int64_t amx_segments(const int64_t *tile, int64_t n_tiles, const int64_t *streams, const int64_t *kv_lens,
                            const uint8_t *prompt, int64_t window, int64_t *seg_of, amx_seg *segs) {
    int64_t n = 0;
    for (int64_t t = 0; t < n_tiles; t++) {
        const int64_t r0 = tile[t];
        seg_of[t] = -1;
        if (!prompt[r0]) continue;
        if (!(t > 0 && seg_of[t - 1] >= 0 && streams[r0] == streams[r0 - 1] && kv_lens[r0] == kv_lens[r0 - 1] + 1))
            segs[n++] = (amx_seg){streams[r0], INT64_MAX, 0, 0, NULL};
        amx_seg *g = &segs[n - 1];
        for (int64_t r = r0; r < tile[t + 1]; r++) {
            const int64_t L = kv_lens[r], lo = window > 0 && L > window ? L - window : 0;
            g->c_lo = lo < g->c_lo ? lo : g->c_lo; g->c_hi = L > g->c_hi ? L : g->c_hi;
        }
        g->nblk = (g->c_hi - g->c_lo / AB * AB + AB - 1) / AB;
        seg_of[t] = n - 1;
    }
    return n;
}

/* Every prompt chunk's K/V prepared, one (segment, KV head, 8 blocks) unit per thread at a time.
   base: the call's geometry (s and h are set per unit). -> 0; -2 out of memory; p->mem stays NULL
   (tiles prepare their own) past AMX_PREP_MAX. */
static int amx_prep_build(amx_prep *p, amx_args base, const void *k, const void *v, const int64_t *tile,
                          int64_t n_tiles, const int64_t *streams, const int64_t *kv_lens, const uint8_t *prompt,
                          int64_t window, int64_t Hkv, int n_threads) {
    p->mem = NULL; p->n = 0;
    p->segs = malloc(n_tiles * sizeof(amx_seg)); p->seg_of = malloc(n_tiles * sizeof(int64_t));
    if (!p->segs || !p->seg_of) return -2;
    p->n = amx_segments(tile, n_tiles, streams, kv_lens, prompt, window, p->seg_of, p->segs);
    const int64_t bw = amx_block_words(base.D);
    int64_t words = 0, units = 0;
    for (int64_t g = 0; g < p->n; g++) { words += p->segs[g].nblk * Hkv * bw; units += Hkv * ((p->segs[g].nblk + 7) / 8); }
    if (words * 4 > AMX_PREP_MAX || words == 0) return 0;
    if (!(p->mem = amx_get(1, words * 4))) return -2;
    for (int64_t g = 0, off = 0; g < p->n; off += p->segs[g].nblk * Hkv * bw, g++) p->segs[g].mem = p->mem + off;
    _Pragma("omp parallel for num_threads(n_threads) schedule(dynamic, 1)")
    for (int64_t u = 0; u < units; u++) {
        int64_t g = 0, x = u;      /* unit u: segment g, head x / per, blocks 8 (x % per) ... */
        while (x >= Hkv * ((p->segs[g].nblk + 7) / 8)) { x -= Hkv * ((p->segs[g].nblk + 7) / 8); g++; }
        const amx_seg *sg = &p->segs[g];
        const int64_t per = (sg->nblk + 7) / 8, h = x / per, b0 = x % per * 8, b1 = b0 + 8 < sg->nblk ? b0 + 8 : sg->nblk;
        amx_args a = base;
        a.s = sg->s; a.h = h;
        amx_prepare(&a, k, v, sg->c_lo, sg->c_hi, b0, b1, sg->mem + (h * sg->nblk + b0) * bw);
    }
    return 0;
}

static void amx_prep_free(amx_prep *p) {
    if (p->mem) amx_put(1);
    free(p->segs); free(p->seg_of);
}
#endif
