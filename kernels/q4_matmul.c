/* q4_matmul.c: the AMX kernel of kernels/q4_matmul.py (the packed layout it reads: that module's
   docstring). Compiled with native.PRELUDE (slotserver/runtime/prelude.h) in front; it compiles
   everywhere, the AMX code under `#if defined(__AMX_TILE__) && ...`, the entry point returning -1
   without it. */
#include <immintrin.h>
#include <omp.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <unistd.h>

#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__AVX512F__) && defined(__AVX512BF16__)
static inline __m512i unpack(const uint8_t *p) {           /* 16 bytes -> 32 bf16 (128 + q) */
    const __m512i w = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)p));
    const __m512i lo = _mm512_and_si512(w, _mm512_set1_epi32(0x0F));
    const __m512i hi = _mm512_and_si512(_mm512_slli_epi32(w, 12), _mm512_set1_epi32(0x000F0000));
    return _mm512_or_si512(_mm512_or_si512(lo, hi), _mm512_set1_epi32(0x43004300));
}

/* Rows [m0, m0+mb) (mb <= 16) against column blocks [nb0, nb1): per (block, group) one tile product
   C[mb x 16] = A[mb x 32 k] . B[16 k-pairs x 16 columns], then y += d * C + z * sum_k x. */
static inline void unpack_group(const uint8_t *wg, uint32_t *b) {
    for (int p = 0; p < 16; p++) _mm512_store_si512(b + p * 16, unpack(wg + p * 16));
}

/* y += d * C + z * sum_k x for (block, group) i, whose C was stored in c; the block's last group
   also writes its 16 output columns and clears y. */
static inline void fold(int64_t i, const float *c, float *y, const float *xs, const float *dz, uint16_t *out,
                        int64_t mb, int64_t N, int64_t G) {
    const int64_t nb = i / G, g = i % G;
    const __m512 d = _mm512_loadu_ps(dz + i * 32), z = _mm512_loadu_ps(dz + i * 32 + 16);
    for (int64_t m = 0; m < mb; m++) {
        const __m512 acc = _mm512_fmadd_ps(z, _mm512_set1_ps(xs[m * G + g]), _mm512_load_ps(y + m * 16));
        _mm512_store_ps(y + m * 16, _mm512_fmadd_ps(d, _mm512_load_ps(c + m * 16), acc));
    }
    if (g == G - 1) {
        for (int64_t m = 0; m < mb; m++)
            _mm256_storeu_si256((__m256i *)(out + m * N + nb * 16), (__m256i)_mm512_cvtneps_pbh(_mm512_load_ps(y + m * 16)));
        memset(y, 0, sizeof(float) * 16 * mb);
    }
}

/* Rows [0, mb) (mb <= 16) against column blocks [nb0, nb1). Per (block, group) one tile product
   C[mb x 16] = A[mb x 32 k] . B[16 k-pairs x 16 columns], then y += d * C + z * sum_k x.
   Software-pipelined: B is unpacked one (block, group) ahead, and C folded one behind, each in
   the other of two buffers. A tile load right after the vector stores that wrote its bytes (or a
   vector load right after a tile store) stalls: 39 vs 21 ns per group measured for B. */
static void rows_block(const uint16_t *x, const float *xs, const uint8_t *w4, const float *dz, uint16_t *out,
                       int64_t mb, int64_t N, int64_t K, int64_t G, int64_t nb0, int64_t nb1) {
    if (nb0 >= nb1) return;
    tile_config cfg = {0};
    cfg.palette = 1;
    cfg.rows[0] = cfg.rows[1] = (uint8_t)mb; cfg.rows[2] = 16;   /* C [mb x 16 f32], A [mb x 32 bf16], B */
    cfg.colsb[0] = cfg.colsb[1] = cfg.colsb[2] = 64;
    _tile_loadconfig(&cfg);
    __attribute__((aligned(64))) uint32_t b[2][16 * 16];
    __attribute__((aligned(64))) float c[2][16 * 16], y[16 * 16];
    const int64_t first = nb0 * G, last = nb1 * G;          /* (block, group) pairs, flattened */
    unpack_group(w4 + first * 256, b[0]);
    memset(y, 0, sizeof(float) * 16 * mb);
    for (int64_t i = first; i < last; i++) {
        const int64_t j = (i - first) & 1;
        if (i + 1 < last) unpack_group(w4 + (i + 1) * 256, b[j ^ 1]);
        _tile_zero(0);
        _tile_loadd(1, x + (i % G) * 32, K * 2);
        _tile_loadd(2, b[j], 64);
        _tile_dpbf16ps(0, 1, 2);
        _tile_stored(0, c[j], 64);
        if (i > first) fold(i - 1, c[j ^ 1], y, xs, dz, out, mb, N, G);
    }
    fold(last - 1, c[(last - 1 - first) & 1], y, xs, dz, out, mb, N, G);
    _tile_release();
}
#endif

/* x: [M, K] bf16 (contiguous), out: [M, N] bf16. -> 0; -1 without AMX (CPU, compiler or kernel
   permission), -2 on bad shapes, -3 out of memory. */
int q4_matmul(const void *x, const void *w4, const void *dz, void *out, int64_t M, int64_t N, int64_t K, int n_threads) {
#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__AVX512F__) && defined(__AVX512BF16__)
    if (!amx_granted()) return -1;
    if (K % 32 || N % 16 || M < 1) return -2;
    const int64_t G = K / 32, NB = N / 16;
    float *xs = malloc(sizeof(float) * M * G);               /* each row's sum over each group of 32 */
    if (!xs) return -3;
    for (int64_t i = 0; i < M * G; i++) {
        float s = 0.0f;
        for (int k = 0; k < 32; k++) s += bf2f(((const uint16_t *)x)[i * 32 + k]);
        xs[i] = s;
    }
    #pragma omp parallel num_threads(n_threads)
    {
        const int nt = omp_get_num_threads(), t = omp_get_thread_num();
        const int64_t nb0 = NB * t / nt, nb1 = NB * (t + 1) / nt;
        for (int64_t m0 = 0; m0 < M; m0 += 16) {
            const int64_t mb = M - m0 < 16 ? M - m0 : 16;
            rows_block((const uint16_t *)x + m0 * K, xs + m0 * G, (const uint8_t *)w4, (const float *)dz,
                       (uint16_t *)out + m0 * N, mb, N, K, G, nb0, nb1);
        }
    }
    free(xs);
    return 0;
#else
    return -1;
#endif
}
