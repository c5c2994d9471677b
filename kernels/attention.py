"""attention: causal attention of a ragged batch of query chunks against a strided KV cache.

Covers decode (one query per sequence) and (chunked) prefill (many). The KV comes as logical
`[stream, cell, kv_head, head_dim]` views (any strides, see `StridedKV`); GQA never repeats K/V.
`cpu(...)` runs every query row, prefill rows included, through the C decode kernel below where it
applies (plain float caches): row r of a sequence is the one-query computation over its keys
0..pos, so its result does not depend on how the prompt was split into chunks, cached or batched
with others (llama.cpp's CPU attention has the same property, and its server tests rely on it:
greedy output with and without a cached prompt must agree). Elsewhere (no compiler, scaled q8
caches) it picks the cheapest torch SDPA formulation per step (docs/performance.md): all-decode
steps unpadded with a broadcast key mask; a mixed step split into its decode rows and its prefill
chunks (`AttnMeta.split`); up to EACH_CHUNK_MAX prefill chunks one call each (no padding, plain
causal for a fresh prompt); more chunks one padded, masked call. Each sequence only reads `max_kv`
cells of its stream; when the batch's streams are contiguous (sequence defragmentation), K/V are
sliced, not gathered.

`triton(...)` (the CUDA path) launches a decode kernel when every sequence has one new token
(`meta.max_q == 1`) and a causal prefill-chunk kernel otherwise; both take the view's strides
(plain, heads-first and q8 views alike) and bound their KV loop by each sequence's own length.

Two per-layer options every implementation reads from `AttnMeta`: `window` (sliding-window
attention, gemma2/3: the query at position p sees keys p-window+1 .. p; 0 is full causal attention)
and `softcap` (gemma2: scores -> softcap * tanh(scores / softcap); 0 is off). The reference masks plainly; the
CPU and Triton paths never touch the cells before a window: their KV ranges start at its first cell.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
import triton as _triton
import triton.language as tl

from slotserver.lab import native
from slotserver.model.batch import AttnMeta, Batch, SeqChunk
from slotserver.lab.kv_spec import StridedKV

OP = "attention"
TOL = {torch.float32: 1e-4, torch.bfloat16: 3e-2}
EACH_CHUNK_MAX = 8   # cpu: up to this many prefill chunks run one SDPA each; more share a padded one


def reference(q: torch.Tensor, kv: StridedKV, meta: AttnMeta, scale: float) -> torch.Tensor:
    """q: [tokens, q_heads, head_dim]; kv: logical [streams, cells, kv_heads, head_dim] -> like q.

    Plain per-sequence, per-query loops in float32: obviously correct, slow. The query at position
    `pos` sees keys `lo .. pos`, lo = pos - window + 1 with a window (else 0).
    """
    window, softcap = meta.window, meta.softcap
    k, v = _dequant(kv.k, kv.k_scale), _dequant(kv.v, kv.v_scale)
    out = torch.empty(q.shape, dtype=torch.float32, device=q.device)
    group = q.shape[1] // k.shape[2]
    for b in range(meta.n_seqs):
        stream, n_q, n_kv = (int(meta.seq_streams[b]), int(meta.q_lens[b]), int(meta.kv_lens[b]))
        keys = k[stream, :n_kv].float().repeat_interleave(group, dim=1)    # [n_kv, q_heads, dim]
        vals = v[stream, :n_kv].float().repeat_interleave(group, dim=1)
        for j in range(n_q):
            row, pos = int(meta.q_offsets[b]) + j, n_kv - n_q + j
            lo = max(0, pos - window + 1) if window else 0
            scores = torch.einsum("hd,khd->hk", q[row].float(), keys[lo: pos + 1]) * scale
            if softcap:
                scores = softcap * torch.tanh(scores / softcap)
            out[row] = torch.einsum("hk,khd->hd", scores.softmax(dim=-1), vals[lo: pos + 1])
    return out.to(q.dtype)


def cpu(q: torch.Tensor, kv: StridedKV, meta: AttnMeta, scale: float) -> torch.Tensor:
    """Same contract as `reference`; the formulation per step is described in the module docstring."""
    window, softcap = meta.window, meta.softcap
    if _native_ok(q, kv, meta):   # every row as a decode row: batch-invariant (module docstring)
        return _native_rows(q, kv, meta, scale, window, softcap)
    if meta.max_q == 1:
        return _cpu_decode(q, kv, meta, scale, window, softcap)
    if meta.split is not None:  # decodes first, then prefill chunks: never pad a decode row
        dec, pre = meta.split
        return torch.cat([_cpu_decode(q[: dec.n_seqs], kv, dec, scale, window, softcap),
                          cpu(q[dec.n_seqs:], kv, pre, scale)])
    if meta.n_seqs <= EACH_CHUNK_MAX:
        return _cpu_each_chunk(q, kv, meta, scale, window, softcap)
    n_seq, max_q, max_kv = meta.n_seqs, meta.max_q, meta.max_kv
    q_heads, dim = q.shape[1], q.shape[2]
    lo = max(0, int((meta.kv_lens - meta.q_lens).min()) - window + 1) if window else 0  # no query sees below
    keys = _dequant(_select(kv.k, meta, lo), _select_scale(kv.k_scale, meta, lo), q.dtype)  # [B, kv_heads, L, dim]
    vals = _dequant(_select(kv.v, meta, lo), _select_scale(kv.v_scale, meta, lo), q.dtype)
    qp = q[meta.pad_index].transpose(1, 2)                              # [B, q_heads, max_q, dim]
    key_pos = torch.arange(lo, max_kv, device=q.device).view(1, 1, 1, max_kv - lo)
    mask = _band(key_pos, meta.pad_positions.view(n_seq, 1, max_q, 1), window)  # [B, 1, max_q, L]
    out = _sdpa(qp, keys, vals, mask, scale, softcap)
    return out.transpose(1, 2).reshape(n_seq * max_q, q_heads, dim)[meta.valid_rows]  # [tokens, q_heads, dim]


def _band(key_pos: torch.Tensor, q_pos: torch.Tensor, window: int) -> torch.Tensor:
    """Which keys a query sees: causal, and within `window` positions when there is one."""
    seen = key_pos <= q_pos
    return seen & (key_pos > q_pos - window) if window else seen


def _sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, scale: float,
          softcap: float, causal: bool = False) -> torch.Tensor:
    """q [B, q_heads, M, dim], k/v [B, kv_heads, L, dim]: torch's SDPA (native GQA); with a softcap
    (which SDPA cannot apply) the same maths written out in float32."""
    gqa = q.shape[1] != k.shape[1]
    if not softcap:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, scale=scale, enable_gqa=gqa)
    group = q.shape[1] // k.shape[1]
    kf, vf = (t.float().repeat_interleave(group, dim=1) for t in (k, v))
    scores = torch.matmul(q.float(), kf.transpose(-1, -2)) * scale     # [B, q_heads, M, L]
    scores = softcap * torch.tanh(scores / softcap)
    if causal:
        mask = torch.ones(scores.shape[-2:], dtype=torch.bool, device=q.device).tril(scores.shape[-1] - scores.shape[-2])
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return torch.matmul(scores.softmax(dim=-1), vf).to(q.dtype)


def _cpu_each_chunk(q: torch.Tensor, kv: StridedKV, meta: AttnMeta, scale: float, window: int = 0,
                    softcap: float = 0.0) -> torch.Tensor:
    """A few prefill chunks, one SDPA each: no padding to the longest chunk, and a fresh prompt (no
    cached prefix) is plain causal. Whole prefill steps in the model: 4 x 128 tokens tie with one
    padded call (176 vs 180 ms); 180 + 3 x 40 tokens: 125 vs 139 ms. One chunk: 2.4x faster
    attention than the padded path. With a window, each chunk reads from its first query's window."""
    outs = []
    for stream, off, n_q, n_kv in zip(*(t.tolist() for t in (meta.seq_streams, meta.q_offsets, meta.q_lens, meta.kv_lens))):
        lo = max(0, n_kv - n_q - window + 1) if window else 0
        keys = _dequant(kv.k[stream, lo:n_kv], None if kv.k_scale is None else kv.k_scale[stream, lo:n_kv], q.dtype)
        vals = _dequant(kv.v[stream, lo:n_kv], None if kv.v_scale is None else kv.v_scale[stream, lo:n_kv], q.dtype)
        causal = n_kv == n_q and not window                               # else: queries sit at the end
        mask = None if causal else _band(torch.arange(lo, n_kv, device=q.device),
                                         torch.arange(n_kv - n_q, n_kv, device=q.device).unsqueeze(1), window)
        out = _sdpa(q[off: off + n_q].transpose(0, 1).unsqueeze(0), keys.transpose(0, 1).unsqueeze(0),
                    vals.transpose(0, 1).unsqueeze(0), mask, scale, softcap, causal)
        outs.append(out[0].transpose(0, 1))                               # [n_q, q_heads, dim]
    return outs[0] if len(outs) == 1 else torch.cat(outs)


def _cpu_decode(q: torch.Tensor, kv: StridedKV, meta: AttnMeta, scale: float, window: int = 0,
                softcap: float = 0.0) -> torch.Tensor:
    """One query per sequence without the C kernel: torch's SDPA with native GQA (K/V never
    repeated) and the key mask `[B, 1, 1, L]` broadcast (no padding), ~1.5x faster than the padded
    path (docs/performance.md)."""
    n_seq, q_heads, dim = q.shape
    max_kv = meta.max_kv
    first = (meta.kv_lens - window).clamp(min=0) if window else torch.zeros_like(meta.kv_lens)  # [B]
    lo = int(first.min())
    keys = _dequant(_select(kv.k, meta, lo), _select_scale(kv.k_scale, meta, lo), q.dtype)  # [B, kv_heads, L, dim]
    vals = _dequant(_select(kv.v, meta, lo), _select_scale(kv.v_scale, meta, lo), q.dtype)
    mask = None  # one sequence sees all its cells from lo: no mask (the SDPA kernel is faster without)
    if n_seq > 1:
        key_pos = torch.arange(lo, max_kv, device=q.device)
        mask = ((key_pos < meta.kv_lens.unsqueeze(1)) & (key_pos >= first.unsqueeze(1))).view(n_seq, 1, 1, max_kv - lo)
    out = _sdpa(q.view(n_seq, q_heads, 1, dim), keys, vals, mask, scale, softcap)
    return out.view(n_seq, q_heads, dim)                                          # [tokens, q_heads, dim]


# The row kernel in C (compiled on first use by `slotserver.lab.native`; without a C compiler the SDPA
# form above serves). One work unit per (tile of query rows, kv head): the tile's query group
# against each K/V row read once, online softmax over aligned blocks of cells, float32 math, bf16
# or float32 in and out.
# What it saves over SDPA is per-call setup: one call per layer, no mask, no gather, no transposes.
NATIVE_C = r"""
#include <stdlib.h>
#if defined(__AVX512F__) || defined(__F16C__)
#include <immintrin.h>
#endif
#define GMAX 16
#define RMAX 64  /* query vectors (row, head) per work unit */
#define DMAX 256
#define BLK 64

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
static inline v16f dot16(const float *q, const float *kb, int64_t stride, int64_t nv) {
    v16f s[16], t[8], u[4], w[2];
    for (int c = 0; c < 16; c++) {
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
/* One K or V row of n elements as float32: kt 0 float32, 1 bf16, 2 float16. */
static inline void load_kv(const void *base, int64_t off, int kt, int64_t n, float *dst) {
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
   chunk), at most RMAX / G of them; a decode row is a tile of its own. -> number of tiles; start
   [n + 1] gets each tile's first row. */
static int64_t row_tiles(const int64_t *streams, const int64_t *kv_lens, int64_t B, int64_t rows_max, int64_t *start) {
    int64_t n = 0;
    for (int64_t r = 0; r < B; r++)
        if (r == 0 || streams[r] != streams[r - 1] || kv_lens[r] != kv_lens[r - 1] + 1 || r - start[n - 1] >= rows_max)
            start[n++] = r;
    start[n] = B;
    return n;
}

/* Work unit: (tile of query rows, kv head h) with the G = Hq/Hkv query heads of each row: R =
   rows x G query vectors, so each K/V row is read once for all of them. Query vector i sees cells
   lo[i] .. hi[i]-1 (its row's kv_len, and window). Online softmax over blocks of BLK cells aligned
   to multiples of BLK: every query vector takes the same steps in the same order whatever tile it
   sits in, so prefill rows, decode rows and rows of differently chunked prompts agree bit for bit.
   q: [B, Hq, D] (strides sq_b, sq_h); k, v: [streams, cells, Hkv, D] (strides s*_s, s*_c, s*_h);
   the head_dim stride is 1 everywhere; out: contiguous [B, Hq, D]. q and out are float32, or bf16
   (`bf16`); K/V elements are float32, bf16 or float16 (`kt` 0, 1, 2: llama.cpp's default cache
   type is f16, half the bytes that decode attention reads at large batches).
   The body is specialised for head_dim 64, 128 and 256 (constant trip counts vectorize fully). */
#define ATTN_BODY(DIM)                                                                                \
    const int64_t D = (DIM);                                                                          \
    _Pragma("omp parallel for num_threads(n_threads) schedule(static, 1)")                           \
    for (int64_t u = 0; u < n_tiles * Hkv; u++) {                                                     \
        const int64_t t = u / Hkv, h = u % Hkv, r0 = tile[t], R = (tile[t + 1] - r0) * G, s = streams[r0]; \
        float qf[RMAX][DPAD(DIM)], acc[RMAX][DIM], kb[BLK][DPAD(DIM)], vb[BLK][DIM], m[RMAX], l[RMAX]; \
        int64_t lo[RMAX], hi[RMAX], c_lo = INT64_MAX, c_hi = 0;                                       \
        for (int64_t j = 0; j < BLK; j++) for (int64_t d = D; d < DPAD(D); d++) kb[j][d] = 0.0f;      \
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
        for (int64_t c0 = c_lo / BLK * BLK; c0 < c_hi; c0 += BLK) {                                   \
            const int64_t n = c_hi - c0 < BLK ? c_hi - c0 : BLK, js = c0 < c_lo ? c_lo - c0 : 0;     \
            for (int64_t j = js; j < n; j++) {         /* the block's K/V rows, as float32, once */  \
                const int64_t c = c0 + j;                                                             \
                if (pf) {                                                                             \
                    prefetch_row(k, s * sk_s + (c + BLK) * sk_c + h * sk_h, kt != 0, D);             \
                    prefetch_row(v, s * sv_s + (c + BLK) * sv_c + h * sv_h, kt != 0, D);             \
                }                                                                                     \
                load_kv(k, s * sk_s + c * sk_c + h * sk_h, kt, D, kb[j]);                             \
                load_kv(v, s * sv_s + c * sv_c + h * sv_h, kt, D, vb[j]);                             \
            }                                                                                         \
            for (int64_t i = 0; i < R; i++) {          /* then each query vector over them */        \
                const int64_t j0 = lo[i] > c0 ? lo[i] - c0 : 0, j1 = hi[i] - c0 < n ? hi[i] - c0 : n; \
                if (j0 >= j1) continue;                                                               \
                float p[BLK], a[DIM];                                                                 \
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
            const float inv = 1.0f / l[i];                                                            \
            const int64_t off = ((r0 + i / G) * Hq + h * G + i % G) * D;                              \
            if (bf16) { uint16_t *o = (uint16_t *)out + off; for (int64_t d = 0; d < D; d++) o[d] = f2bf(acc[i][d] * inv); } \
            else { float *o = (float *)out + off; for (int64_t d = 0; d < D; d++) o[d] = acc[i][d] * inv; } \
        }                                                                                             \
    }

/* B query rows (decode rows, or every row of a batch): row r of stream streams[r] sees its first
   kv_lens[r] cells (causal: its position + 1). -> 0, -1 for an unsupported group or head_dim, -2
   out of memory. */
int decode_attention(const void *q, const void *k, const void *v, void *out,
                     const int64_t *streams, const int64_t *kv_lens, int64_t B, int64_t Hq, int64_t Hkv, int64_t Dim,
                     int64_t sq_b, int64_t sq_h, int64_t sk_s, int64_t sk_c, int64_t sk_h,
                     int64_t sv_s, int64_t sv_c, int64_t sv_h, int64_t window, float scale, float softcap,
                     int bf16, int kt, int n_threads) {
    const int64_t G = Hq / Hkv;
    if (G > GMAX || Dim > DMAX || G * Hkv != Hq) return -1;
    int64_t *tile = malloc((B + 1) * sizeof(int64_t));
    if (!tile) return -2;
    const int64_t n_tiles = row_tiles(streams, kv_lens, B, RMAX / G, tile);
    if (Dim == 64) { ATTN_BODY(64) }
    else if (Dim == 128) { ATTN_BODY(128) }
    else if (Dim == 256) { ATTN_BODY(256) }   /* gemma2/3: the generic body ran ~2 GFLOP/s there */
    else { ATTN_BODY(Dim) }
    free(tile);
    return 0;
}
"""
_LIB = native.build("attention_decode", NATIVE_C, origin=__file__, strict=True)
native.signature(_LIB, "decode_attention", 6, 13, (native.ctypes.c_float, native.ctypes.c_float, native.ctypes.c_int,
                                                   native.ctypes.c_int, native.ctypes.c_int), replay=True)
_KV_TYPES = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}
_Q_TYPES = (torch.float32, torch.bfloat16)


def _native_ok(q: torch.Tensor, kv: StridedKV, meta: AttnMeta) -> bool:
    """The C kernel reads raw memory: only plain float CPU caches of q's head size, unit head_dim
    strides, int64 per-row metadata (`meta.row_streams`, `meta.row_kv_lens`) of q's rows, and
    streams that exist. (Ordered and written for a decode step's ~30 calls.)"""
    seq_streams, kv_lens, k, v = meta.row_streams, meta.row_kv_lens, kv.k, kv.v
    if _LIB is None or kv.k_scale is not None or seq_streams is None or kv_lens is None:
        return False
    qs, ks = q.shape, k.shape
    if len(qs) != 3 or len(ks) != 4 or v.shape != ks or ks[3] != qs[2] or qs[0] != seq_streams.shape[0] \
            or qs[2] > 256 or qs[1] % ks[2] or qs[1] // ks[2] > 16 or meta.max_kv > ks[1]:
        return False
    if q.dtype not in _Q_TYPES or k.dtype != v.dtype or k.dtype not in _KV_TYPES \
            or seq_streams.dtype != torch.int64 or kv_lens.dtype != torch.int64:
        return False
    if q.stride(2) != 1 or k.stride(3) != 1 or v.stride(3) != 1 or not seq_streams.is_contiguous() \
            or not kv_lens.is_contiguous() or not (q.is_cpu and k.is_cpu and v.is_cpu and seq_streams.is_cpu
                                                   and kv_lens.is_cpu):
        return False
    top = meta.stream_base + meta.n_seqs if meta.stream_base is not None else int(meta.seq_streams.max()) + 1
    return top <= ks[0]


def _native_rows(q: torch.Tensor, kv: StridedKV, meta: AttnMeta, scale: float, window: int = 0,
                 softcap: float = 0.0) -> torch.Tensor:
    """Every flat row of q as one decode query over its stream's first row_kv_lens cells."""
    n_seq, q_heads, dim = q.shape
    streams, kv_lens = meta.row_streams, meta.row_kv_lens
    out = torch.empty((n_seq, q_heads, dim), dtype=q.dtype)                        # [tokens, q_heads, dim]
    rc = _LIB.decode_attention(
        q.data_ptr(), kv.k.data_ptr(), kv.v.data_ptr(), out.data_ptr(), streams.data_ptr(),
        kv_lens.data_ptr(), n_seq, q_heads, kv.k.shape[2], dim, q.stride(0), q.stride(1),
        *kv.k.stride()[:3], *kv.v.stride()[:3], window, scale, softcap, native.is_bf16(q), _KV_TYPES[kv.k.dtype],
        torch.get_num_threads())
    if rc != 0:
        raise RuntimeError(f"decode_attention (C) failed with {rc}: unsupported group or head_dim")
    return out


def _select(cache: torch.Tensor, meta: AttnMeta, lo: int = 0) -> torch.Tensor:
    """The batch's streams, cells `lo .. max_kv-1`, as `[B, kv_heads, max_kv - lo, dim]`."""
    if meta.stream_base is not None:
        part = cache[meta.stream_base: meta.stream_base + meta.n_seqs, lo: meta.max_kv]
    else:
        part = cache[:, lo: meta.max_kv].index_select(0, meta.seq_streams)
    return part.transpose(1, 2)


def _select_scale(scale: torch.Tensor | None, meta: AttnMeta, lo: int = 0) -> torch.Tensor | None:
    """Scales `[streams, cells, kv_heads]` of the batch -> `[B, kv_heads, max_kv - lo, 1]`."""
    return None if scale is None else _select(scale.unsqueeze(-1), meta, lo)


def _dequant(x: torch.Tensor, scale: torch.Tensor | None, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    if scale is None:
        return x if x.dtype == dtype else x.to(dtype)
    if scale.dim() == x.dim() - 1:
        scale = scale.unsqueeze(-1)
    return (x.float() * scale.float()).to(dtype)


LOG2E = 1.4426950408889634
DECODE_BLOCK_N = 16
PREFILL_BLOCK_M = 32
PREFILL_BLOCK_N = 32


@_triton.jit
def _dot(a, b, IEEE_DOT: tl.constexpr):
    """`a @ b` accumulated in float32. IEEE_DOT multiplies in exact float32: for float32 caches
    (no tf32 rounding) and under the interpreter, whose tl.dot multiplies bf16 bit patterns as
    integers. Inputs are already rounded to their dtype, so the result matches a bf16 MMA."""
    if IEEE_DOT:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    return tl.dot(a, b)


@_triton.jit
def _softcap(s, softcap):
    """Scores in log2 units (`q.k * scale * log2 e`) soft-capped in natural units: c * tanh(x / c),
    tanh(y) = 1 - 2 / (e^{2y} + 1) (saturates cleanly at +-1 where e^{2y} overflows or vanishes)."""
    y = s / (1.4426950408889634 * softcap)
    return (softcap * 1.4426950408889634) * (1.0 - 2.0 / (tl.exp(2.0 * y) + 1.0))


@_triton.jit
def _attn_decode_kernel(q_ptr, k_ptr, v_ptr, ks_ptr, vs_ptr, out_ptr, streams_ptr, kv_lens_ptr, q_offsets_ptr,
                        stride_qt, stride_qh, stride_ks, stride_kc, stride_kh, stride_vs, stride_vc, stride_vh,
                        stride_ss, stride_sc, stride_sh, stride_ot, stride_oh, qk_scale, window, softcap,
                        GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_G: tl.constexpr,
                        BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr, QUANT: tl.constexpr,
                        SOFTCAP: tl.constexpr):
    """Program (sequence b, KV head h): the GROUP query heads of h for b's single new token.

    The loop runs over b's own cells, from its window's first (0 without one) to kv_len, so the
    masked cells on either side are never read; K/V addresses use the view's strides (any strided
    layout), q8 rows are scaled as they are loaded.
    """
    b = tl.program_id(0)
    h = tl.program_id(1)
    stream = tl.load(streams_ptr + b).to(tl.int64)
    kv_len = tl.load(kv_lens_ptr + b)
    row = tl.load(q_offsets_ptr + b).to(tl.int64)
    g = tl.arange(0, BLOCK_G)
    d = tl.arange(0, BLOCK_D)
    n = tl.arange(0, BLOCK_N)
    gd_mask = (g[:, None] < GROUP) & (d[None, :] < HEAD_DIM)
    q = tl.load(q_ptr + row * stride_qt + (h * GROUP + g)[:, None] * stride_qh + d[None, :],
                mask=gd_mask, other=0.0).to(tl.float32) * qk_scale              # [BLOCK_G, BLOCK_D]
    k_base = k_ptr + stream * stride_ks + h * stride_kh
    v_base = v_ptr + stream * stride_vs + h * stride_vh
    s_base = stream * stride_ss + h * stride_sh
    m_i = tl.full([BLOCK_G], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, BLOCK_D], tl.float32)
    lo = tl.where(window > 0, tl.maximum(kv_len - window, 0), 0)
    for start in range(lo, kv_len, BLOCK_N):
        cells = start + n
        c_mask = cells < kv_len
        nd_mask = c_mask[:, None] & (d[None, :] < HEAD_DIM)
        k = tl.load(k_base + cells[:, None] * stride_kc + d[None, :], mask=nd_mask, other=0.0).to(tl.float32)
        v = tl.load(v_base + cells[:, None] * stride_vc + d[None, :], mask=nd_mask, other=0.0).to(tl.float32)
        if QUANT:
            k = k * tl.load(ks_ptr + s_base + cells * stride_sc, mask=c_mask, other=0.0)[:, None]
            v = v * tl.load(vs_ptr + s_base + cells * stride_sc, mask=c_mask, other=0.0)[:, None]
        s = tl.sum(q[:, None, :] * k[None, :, :], axis=2)                       # [BLOCK_G, BLOCK_N]
        if SOFTCAP:
            s = _softcap(s, softcap)
        s = tl.where(c_mask[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.sum(p[:, :, None] * v[None, :, :], axis=1)
        m_i = m_new
    out = acc / l_i[:, None]
    tl.store(out_ptr + row * stride_ot + (h * GROUP + g)[:, None] * stride_oh + d[None, :],
             out.to(out_ptr.dtype.element_ty), mask=gd_mask)


@_triton.jit
def _attn_prefill_kernel(q_ptr, k_ptr, v_ptr, ks_ptr, vs_ptr, out_ptr, streams_ptr, q_lens_ptr, kv_lens_ptr,
                         q_offsets_ptr, stride_qt, stride_qh, stride_ks, stride_kc, stride_kh, stride_vs,
                         stride_vc, stride_vh, stride_ss, stride_sc, stride_sh, stride_ot, stride_oh, qk_scale,
                         window, softcap, GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
                         BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr, QUANT: tl.constexpr,
                         IEEE_DOT: tl.constexpr, SOFTCAP: tl.constexpr):
    """Program (sequence b, KV head h, row tile): a causal chunk of b's new queries against its cache.

    Rows fold the GQA group into the query axis: row r is query j = r // GROUP, head h*GROUP + r % GROUP,
    at position kv_len - q_len + j. The KV loop stops at the tile's last position (causal bound)
    and, with a window, starts at the first cell the tile's first query sees.
    """
    b = tl.program_id(0)
    h = tl.program_id(1)
    q_len = tl.load(q_lens_ptr + b)
    if tl.program_id(2) * BLOCK_M >= q_len * GROUP:
        return
    stream = tl.load(streams_ptr + b).to(tl.int64)
    kv_len = tl.load(kv_lens_ptr + b)
    q_off = tl.load(q_offsets_ptr + b).to(tl.int64)
    r = tl.program_id(2) * BLOCK_M + tl.arange(0, BLOCK_M)
    j = r // GROUP
    r_mask = r < q_len * GROUP
    pos = kv_len - q_len + j                                                     # [BLOCK_M]
    d = tl.arange(0, BLOCK_D)
    n = tl.arange(0, BLOCK_N)
    d_mask = d[None, :] < HEAD_DIM
    q_rows = (q_off + j)[:, None] * stride_qt + (h * GROUP + r % GROUP)[:, None] * stride_qh + d[None, :]
    q = tl.load(q_ptr + q_rows, mask=r_mask[:, None] & d_mask, other=0.0)       # [BLOCK_M, BLOCK_D]
    k_base = k_ptr + stream * stride_ks + h * stride_kh
    v_base = v_ptr + stream * stride_vs + h * stride_vh
    s_base = stream * stride_ss + h * stride_sh
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    hi = tl.minimum(kv_len, tl.max(tl.where(r_mask, pos, 0), axis=0) + 1)
    lo = tl.where(window > 0, tl.maximum(tl.min(tl.where(r_mask, pos, kv_len), axis=0) - window + 1, 0), 0)
    for start in range(lo, hi, BLOCK_N):
        cells = start + n
        c_mask = cells < hi
        nd_mask = c_mask[:, None] & d_mask
        k = tl.load(k_base + cells[:, None] * stride_kc + d[None, :], mask=nd_mask, other=0.0)
        v = tl.load(v_base + cells[:, None] * stride_vc + d[None, :], mask=nd_mask, other=0.0)
        if QUANT:
            k = (k.to(tl.float32) * tl.load(ks_ptr + s_base + cells * stride_sc, mask=c_mask, other=0.0)[:, None])
            v = (v.to(tl.float32) * tl.load(vs_ptr + s_base + cells * stride_sc, mask=c_mask, other=0.0)[:, None])
        k, v = k.to(q.dtype), v.to(q.dtype)            # q8 (scaled above) or an f16 cache under f32/bf16 q
        s = _dot(q, tl.trans(k), IEEE_DOT) * qk_scale    # [BLOCK_M, BLOCK_N]
        if SOFTCAP:
            s = _softcap(s, softcap)
        seen = (cells[None, :] <= pos[:, None]) & c_mask[None, :]
        seen = seen & ((cells[None, :] > pos[:, None] - window) | (window == 0))
        s = tl.where(seen, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + _dot(p.to(v.dtype), v, IEEE_DOT)
        m_i = m_new
    out = acc / l_i[:, None]
    o_rows = (q_off + j)[:, None] * stride_ot + (h * GROUP + r % GROUP)[:, None] * stride_oh + d[None, :]
    tl.store(out_ptr + o_rows, out.to(out_ptr.dtype.element_ty), mask=r_mask[:, None] & d_mask)

def triton(q: torch.Tensor, kv: StridedKV, meta: AttnMeta, scale: float) -> torch.Tensor:
    """Same contract as `cpu`: q [tokens, q_heads, head_dim], kv logical [streams, cells, kv_heads, head_dim]."""
    _check(q, kv, meta)
    kv_heads, dim = kv.k.shape[2], q.shape[2]
    group = q.shape[1] // kv_heads
    quant = kv.k_scale is not None
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    ks, vs = (kv.k_scale, kv.v_scale) if quant else (kv.k, kv.v)  # unused pointers without q8
    args = (q.stride(0), q.stride(1), *kv.k.stride()[:3], *kv.v.stride()[:3],
            *(kv.k_scale.stride() if quant else (0, 0, 0)), out.stride(0), out.stride(1), scale * LOG2E,
            meta.window, float(meta.softcap or 1.0))
    if meta.max_q == 1:
        _attn_decode_kernel[(meta.n_seqs, kv_heads)](
            q, kv.k, kv.v, ks, vs, out, meta.seq_streams, meta.kv_lens, meta.q_offsets, *args,
            GROUP=group, HEAD_DIM=dim, BLOCK_G=_triton.next_power_of_2(group),
            BLOCK_D=_triton.next_power_of_2(dim), BLOCK_N=DECODE_BLOCK_N, QUANT=quant, SOFTCAP=bool(meta.softcap))
    else:
        grid = (meta.n_seqs, kv_heads, _triton.cdiv(meta.max_q * group, PREFILL_BLOCK_M))
        _attn_prefill_kernel[grid](
            q, kv.k, kv.v, ks, vs, out, meta.seq_streams, meta.q_lens, meta.kv_lens, meta.q_offsets, *args,
            GROUP=group, HEAD_DIM=dim, BLOCK_M=PREFILL_BLOCK_M, BLOCK_D=max(16, _triton.next_power_of_2(dim)),
            BLOCK_N=PREFILL_BLOCK_N, QUANT=quant, IEEE_DOT=q.dtype == torch.float32 or _interpreted(),
            SOFTCAP=bool(meta.softcap))
    return out


def _interpreted() -> bool:
    """True when triton was imported with TRITON_INTERPRET=1 (kernels run on CPU tensors)."""
    return type(_attn_prefill_kernel).__name__ == "InterpretedFunction"


def _check(q: torch.Tensor, kv: StridedKV, meta: AttnMeta) -> None:
    assert q.dim() == 3 and q.stride(2) == 1, f"q must be [tokens, q_heads, head_dim], unit last stride: {q.stride()}"
    assert kv.k.dim() == 4 and kv.k.shape == kv.v.shape, "k, v must be [streams, cells, kv_heads, head_dim]"
    assert kv.k.shape[3] == q.shape[2] and q.shape[1] % kv.k.shape[2] == 0, "head_dim / GQA group mismatch"
    assert kv.k.stride(3) == 1 and kv.v.stride(3) == 1, "head_dim must be the innermost dim of the view"
    if kv.k_scale is not None:
        assert kv.k.dtype == kv.v.dtype == torch.int8 and kv.v_scale is not None
        assert kv.k_scale.shape == kv.k.shape[:3] and kv.k_scale.stride() == kv.v_scale.stride()
        assert kv.k_scale.dtype == kv.v_scale.dtype == torch.float32
    else:
        assert kv.k.dtype == kv.v.dtype and kv.k.dtype in (q.dtype, torch.float16), \
            f"kv {kv.k.dtype} must match q {q.dtype} or be float16"
    for t in (meta.seq_streams, meta.q_lens, meta.kv_lens, meta.q_offsets):
        assert t.dtype == torch.int64 and t.is_contiguous() and t.device == q.device


def example_inputs(gen: torch.Generator, dtype: torch.dtype) -> tuple:
    """A random ragged batch (mixed decode and prefill chunks, all decode, or all prefill, fresh
    prompts included) on shuffled streams, over a plain, a heads-first (strided), a q8 or an f16 cache;
    odd head_dim and group sizes included."""
    kv_heads = int(torch.randint(1, 4, (), generator=gen))
    group = int(torch.randint(1, 4, (), generator=gen))
    dim = int(torch.randint(2, 41, (), generator=gen))
    n_streams, n_cells = 12, 40   # up to 12 sequences: both sides of EACH_CHUNK_MAX
    n_seq = int(torch.randint(1, n_streams + 1, (), generator=gen))
    streams = torch.randperm(n_streams, generator=gen)[:n_seq].tolist()
    mode = float(torch.rand((), generator=gen))  # < 0.3: all decode; > 0.8: all prefill (start 0 or not)
    chunks = []
    for s in streams:
        start = int(torch.randint(0, 30, (), generator=gen)) if mode <= 0.9 else 0
        prefill = mode > 0.8 or (mode >= 0.3 and torch.rand((), generator=gen) >= 0.5)
        n_new = int(torch.randint(2, 10, (), generator=gen)) if prefill else 1
        chunks.append(SeqChunk(stream=s, start=start, tokens=[0] * n_new))
    if torch.rand((), generator=gen) < 0.5:  # the engine's order, decodes first (AttnMeta.split)
        chunks.sort(key=lambda c: len(c.tokens) > 1)
    meta = example_layer(Batch.build(chunks).attn, gen)
    # q as the model passes it: the query heads of the roped q|k rows (a strided view)
    q = torch.randn(sum(len(c.tokens) for c in chunks), kv_heads * (group + 1), dim, generator=gen)[:, : kv_heads * group]
    k = torch.randn(n_streams, n_cells, kv_heads, dim, generator=gen)
    v = torch.randn(n_streams, n_cells, kv_heads, dim, generator=gen)
    return q.to(dtype), _example_view(k, v, dtype, int(torch.randint(0, 4, (), generator=gen))), meta, 1 / math.sqrt(dim)


def example_layer(meta: AttnMeta, gen: torch.Generator) -> AttnMeta:
    """Half the cases under a sliding window (1 to 24 cells: shorter and longer than the
    sequences), a third soft-capped (a cap of 0.5 to 3: well inside the scores' range)."""
    window = int(torch.randint(1, 25, (), generator=gen)) if torch.rand((), generator=gen) < 0.5 else 0
    softcap = 0.5 + 2.5 * float(torch.rand((), generator=gen)) if torch.rand((), generator=gen) < 0.33 else 0.0
    return meta.with_layer(window, softcap)


def _example_view(k: torch.Tensor, v: torch.Tensor, dtype: torch.dtype, kind: int) -> StridedKV:
    """kind 0: contiguous (seq_head_dim); 1: heads-first storage, permuted view; 2: int8 + scales;
    3: a float16 cache (`--cache-type-k f16`, the serving default) under queries of `dtype`."""
    if kind == 3:
        return StridedKV(k.half(), v.half())
    if kind == 1:
        k, v = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in (k, v))
    if kind != 2:
        return StridedKV(k.to(dtype), v.to(dtype))
    scales = [t.abs().amax(dim=-1) / 127 for t in (k, v)]
    k8, v8 = (torch.round(t / s.unsqueeze(-1)).to(torch.int8) for t, s in zip((k, v), scales))
    return StridedKV(k8, v8, *scales)


def _aot(dtype: str, quant: bool, decode: bool, group: int = 3, dim: int = 64) -> tuple:
    cache = "i8" if quant else dtype
    sig = {"q_ptr": f"*{dtype}", "k_ptr": f"*{cache}", "v_ptr": f"*{cache}", "ks_ptr": "*fp32",
           "vs_ptr": "*fp32", "out_ptr": f"*{dtype}", "streams_ptr": "*i64"}
    sig |= {"kv_lens_ptr": "*i64"} if decode else {"q_lens_ptr": "*i64", "kv_lens_ptr": "*i64"}
    sig |= {"q_offsets_ptr": "*i64"}
    sig |= {n: "i32" for n in ("stride_qt", "stride_qh", "stride_ks", "stride_kc", "stride_kh", "stride_vs",
                               "stride_vc", "stride_vh", "stride_ss", "stride_sc", "stride_sh",
                               "stride_ot", "stride_oh")}
    sig |= {"qk_scale": "fp32", "window": "i32", "softcap": "fp32"}
    pow2 = lambda n: 1 << (n - 1).bit_length()   # noqa: E731 - triton.next_power_of_2, without importing triton here
    const = {"GROUP": group, "HEAD_DIM": dim, "BLOCK_D": pow2(dim), "QUANT": quant, "SOFTCAP": False}
    if decode:
        const |= {"BLOCK_G": pow2(group), "BLOCK_N": DECODE_BLOCK_N}
    else:
        const |= {"BLOCK_M": PREFILL_BLOCK_M, "BLOCK_N": PREFILL_BLOCK_N, "IEEE_DOT": dtype == "fp32"}
    sig |= {name: "constexpr" for name in const}
    return (_attn_decode_kernel if decode else _attn_prefill_kernel, sig, const)


# SmolLM2-135M geometry (group 3, head_dim 64): bf16 and q8 caches, decode and prefill.
AOT = [_aot("bf16", False, True), _aot("bf16", True, True), _aot("bf16", False, False),
       _aot("bf16", True, False), _aot("fp32", False, True)]
