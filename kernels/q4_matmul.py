"""q4_matmul: `y = x @ W^T` for 4-bit weights (groups of 32 along `in`, w = d * q + m, q in 0..15:
Q4_1 re-encoded exactly) in the AMX kernel's packed layout; the `--weights int4|auto4` path.

Why AMX tiles: torch's `_weight_int4pack_mm_for_cpu` works on blocks of 4 rows and unpacks the
whole weight again for each block, in float32 FMAs: 8 rows cost 2.5x one row, 16 rows 4.7x. Here,
per block of 16 output columns and group of 32 inputs, the 4-bit weights become one bf16 AMX B tile
and one `tdpbf16ps` serves up to 16 rows, so the cost is nearly flat in rows (30 layers' matmuls of
SmolLM2: 6.1 ms at 1 row, 6.9 at 8, 8.1 at 16; torch 5.2 / 13.3 / 24.8; docs/performance.md).
The default `--weights auto` computes on the GGUF blocks themselves instead (kernels/qmatmul.py);
this op stays for AMX hosts, where it was measured fastest at 3-32 rows of Q4_1.

Layout (`pack`, fixed at load: a reload of this file must keep it):
- `w4`: `[out/16, in/32, 16, 16]` bytes: column block, group, k pair p, column i -> the byte
  `q[i][2p] | q[i][2p+1] << 4`. Widened to 32-bit lanes, masked and OR-ed with 0x4300 per half,
  a byte becomes the bf16 pair (128 + q[i][2p], 128 + q[i][2p+1]): exactly row p of the B tile
  (AMX's pair-interleaved layout), no table, no conversion.
- `dz`: `[out/16, in/32, 2, 16]` float32: d, and z = m - 128 d, so that per group
  y += d * sum_k x_k (128 + q_k) + z * sum_k x_k.
`cpu`: the AMX C kernel (bf16 activations and output, float32 sums) where the CPU variant is `amx`
(`slotserver.lab.cpu_features`), the compiler has AMX-BF16 and the OS grants tile data; elsewhere
(and for the AMX-less variants) the reference. The C compiles everywhere: the AMX code sits under
`#if defined(__AMX_TILE__) && ...` and the entry point returns -1 without it.
TOL: x and the output rounded to bf16 (2^-9 relative each) on outputs of RMS ~1: 2e-2.
"""

from __future__ import annotations

import ctypes
import functools

import torch
import triton as _triton
import triton.language as tl

from slotserver.lab import cpu_features
from slotserver.lab import native

OP = "q4_matmul"
TOL = {torch.float32: 2e-2, torch.bfloat16: 2e-2}
GROUP = 32

SOURCE = r"""
#include <immintrin.h>
#include <omp.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <unistd.h>

#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__AVX512F__) && defined(__AVX512BF16__)
typedef struct { uint8_t palette, start_row, reserved[14]; uint16_t colsb[16]; uint8_t rows[16]; } tile_config;

static int amx_state = 0;   /* 0 unknown, 1 granted, -1 refused; Linux asks each process to request it */
static int amx_granted(void) {
    if (amx_state == 0) amx_state = syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XTILEDATA */) == 0 ? 1 : -1;
    return amx_state == 1;
}

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
"""

_LIB = native.build("q4_matmul", SOURCE, origin=__file__)
native.signature(_LIB, "q4_matmul", 4, 3, (ctypes.c_int,))


def unpack(w4: torch.Tensor, dz: torch.Tensor) -> torch.Tensor:
    """The packed weight as float32 `[out, in]` (w = d * q + m)."""
    nb, g = w4.shape[:2]
    q = torch.stack([w4 & 15, w4 >> 4], dim=-1)                          # [nb, g, p, i, j]
    q = q.permute(0, 3, 1, 2, 4).reshape(nb * 16, g * GROUP).float()      # [out, in]
    d, z = (dz[:, :, c].permute(0, 2, 1).reshape(nb * 16, g) for c in (0, 1))  # [out, groups]
    m = z + 128 * d
    return (q.view(nb * 16, g, GROUP) * d[..., None] + m[..., None]).view(nb * 16, g * GROUP)


def reference(x: torch.Tensor, w4: torch.Tensor, dz: torch.Tensor) -> torch.Tensor:
    """Dequantize, then a float32 matmul: x [rows, in] -> [rows, out] in x's dtype."""
    return (x.float() @ unpack(w4.cpu(), dz.cpu()).to(x.device).T).to(x.dtype)


@functools.cache
def available() -> bool:
    """The CPU variant allows AMX, the library was built with it, and the OS lets this process use
    the tiles (one trial call)."""
    if _LIB is None or not cpu_features.current().amx:
        return False
    x, out = torch.zeros(1, GROUP, dtype=torch.bfloat16), torch.empty(1, 16, dtype=torch.bfloat16)
    w4, dz = torch.zeros(1, 1, 16, 16, dtype=torch.uint8), torch.zeros(1, 1, 2, 16)
    return _LIB.q4_matmul(x.data_ptr(), w4.data_ptr(), dz.data_ptr(), out.data_ptr(), 1, 16, GROUP, 1) == 0


def pack(q: torch.Tensor, d: torch.Tensor, m: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """q: [out, in] ints 0..15; d, m: [out, in/32] -> (w4, dz) in the layout above."""
    n, k = q.shape
    assert k % GROUP == 0 and n % 16 == 0, f"q4_matmul needs in % 32 == 0 and out % 16 == 0, got {tuple(q.shape)}"
    g = k // GROUP
    pairs = q.to(torch.uint8).view(n // 16, 16, g, 16, 2)                       # [nb, i, g, p, j]
    w4 = (pairs[..., 0] | (pairs[..., 1] << 4)).permute(0, 2, 3, 1).contiguous()  # [nb, g, p, i]
    d16, m16 = (t.float().view(n // 16, 16, g).permute(0, 2, 1) for t in (d, m))  # [nb, g, i]
    dz = torch.stack([d16, m16 - 128 * d16], dim=2).contiguous()                 # [nb, g, 2, i]
    return w4, dz


def cpu_path() -> str:
    """What `cpu` computes with here (shown in /props, /lab and `slotserver top`)."""
    return "AMX bf16 tiles" if available() else "torch reference (no AMX in this CPU variant)"


def cpu(x: torch.Tensor, w4: torch.Tensor, dz: torch.Tensor) -> torch.Tensor:
    """x: [rows, in] -> [rows, out] in x's dtype: the AMX kernel where it runs, else the reference."""
    if not available():
        return reference(x, w4, dz)
    xb = x.to(torch.bfloat16).contiguous()
    rows, k = xb.shape
    nb, g = w4.shape[:2]
    if not (w4.dtype == torch.uint8 and w4.shape == (nb, g, 16, 16) and w4.is_contiguous() and k == g * GROUP
            and dz.dtype == torch.float32 and dz.shape == (nb, g, 2, 16) and dz.is_contiguous()):
        raise ValueError(f"q4_matmul: x {tuple(x.shape)} does not fit w4 {tuple(w4.shape)} / dz {tuple(dz.shape)}")
    out = torch.empty((rows, nb * 16), dtype=torch.bfloat16)
    rc = _LIB.q4_matmul(xb.data_ptr(), w4.data_ptr(), dz.data_ptr(), out.data_ptr(), rows, nb * 16, k,
                        torch.get_num_threads())
    if rc != 0:
        raise RuntimeError(f"q4_matmul (C) failed with {rc}")
    return out.to(x.dtype)


@_triton.jit
def _q4_matmul_kernel(x_ptr, w_ptr, y_ptr, M, N, K, stride_x, stride_w, stride_y,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """One program per [BLOCK_M, BLOCK_N] tile of y = x @ w^T, float32 accumulation."""
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    j = tl.arange(0, BLOCK_K)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k = k0 + j
        xt = tl.load(x_ptr + offs_m[:, None].to(tl.int64) * stride_x + k[None, :],
                     mask=(offs_m[:, None] < M) & (k[None, :] < K), other=0.0).to(tl.float32)   # [BM, BK]
        wt = tl.load(w_ptr + offs_n[:, None].to(tl.int64) * stride_w + k[None, :],
                     mask=(offs_n[:, None] < N) & (k[None, :] < K), other=0.0).to(tl.float32)   # [BN, BK]
        acc += tl.dot(xt, tl.trans(wt))
    tl.store(y_ptr + offs_m[:, None].to(tl.int64) * stride_y + offs_n[None, :], acc.to(y_ptr.dtype.element_ty),
             mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))


TRITON_BLOCK_M, TRITON_BLOCK_N, TRITON_BLOCK_K = 16, 32, 32


def triton(x: torch.Tensor, w4: torch.Tensor, dz: torch.Tensor) -> torch.Tensor:
    """On a GPU (or the interpreter): the groups unpacked to a dense float weight on x's device
    (this packing is AMX's tile order; a GPU has no use for it), then a Triton matmul."""
    w = unpack(w4.to(x.device), dz.to(x.device)).float().contiguous()          # [out, in]
    x = x.contiguous()
    y = torch.empty(x.shape[0], w.shape[0], dtype=x.dtype, device=x.device)
    if x.shape[0] and w.shape[0]:
        grid = (_triton.cdiv(x.shape[0], TRITON_BLOCK_M), _triton.cdiv(w.shape[0], TRITON_BLOCK_N))
        _q4_matmul_kernel[grid](x, w, y, x.shape[0], w.shape[0], w.shape[1], x.stride(0), w.stride(0), y.stride(0),
                                BLOCK_M=TRITON_BLOCK_M, BLOCK_N=TRITON_BLOCK_N, BLOCK_K=TRITON_BLOCK_K)
    return y


def _aot(x: str) -> tuple:
    sig = {"x_ptr": f"*{x}", "w_ptr": "*fp32", "y_ptr": f"*{x}", "M": "i32", "N": "i32", "K": "i32",
           "stride_x": "i32", "stride_w": "i32", "stride_y": "i32",
           "BLOCK_M": "constexpr", "BLOCK_N": "constexpr", "BLOCK_K": "constexpr"}
    return (_q4_matmul_kernel, sig, {"BLOCK_M": TRITON_BLOCK_M, "BLOCK_N": TRITON_BLOCK_N, "BLOCK_K": TRITON_BLOCK_K})


AOT = [_aot("bf16"), _aot("fp32")]


def example_inputs(gen: torch.Generator, dtype: torch.dtype) -> tuple:
    """x [rows, in] unit-variance; a random 4-bit weight with outputs of RMS ~1, packed."""
    rows = int(torch.randint(1, 40, (), generator=gen))
    n, g = 16 * int(torch.randint(1, 5, (), generator=gen)), int(torch.randint(1, 7, (), generator=gen))
    q = torch.randint(0, 16, (n, g * GROUP), generator=gen)
    d = (torch.rand(n, g, generator=gen) + 0.5) * (0.3 / (g * GROUP) ** 0.5)
    m = -7.5 * d * (0.5 + torch.rand(n, g, generator=gen))
    return (torch.randn(rows, g * GROUP, generator=gen).to(dtype), *pack(q, d, m))
