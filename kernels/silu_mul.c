/* silu_mul.c: the CPU kernel of kernels/silu_mul.py, compiled with native.PRELUDE
   (slotserver/runtime/prelude.h) in front.

   silu(g) * u per element in float32, one rounding, with the native prelude's silu_mul1 /
   silu_mul8 / silu_mul16 (shared with qmatmul's fused prologue). Rows split over the threads
   from 8K elements on. */
int silu_mul(const void *gu, void *out, int64_t T, int64_t F, int64_t sg, int b, int n_threads) {
    #pragma omp parallel for num_threads(n_threads) if (T * F >= 8192) schedule(static)
    for (int64_t t = 0; t < T; t++) {
        int64_t i = 0;
#ifdef SLOT_AVX512
        for (; i + 16 <= F; i += 16)
            store16(out, t * F + i, b, silu_mul16(load16(gu, t * sg + i, b), load16(gu, t * sg + F + i, b)));
#elif defined(SLOT_AVX2)   /* qmatmul's fused prologue runs the same 8 lanes: the same floats */
        for (; i + 8 <= F; i += 8)
            store8(out, t * F + i, b, silu_mul8(load8(gu, t * sg + i, b), load8(gu, t * sg + F + i, b)));
#endif
        /* b is tested once per row, not per element: with a constant b the loop vectorizes (AVX2) */
        if (b) for (; i < F; i++) st(out, t * F + i, 1, silu_mul1(ld(gu, t * sg + i, 1), ld(gu, t * sg + F + i, 1)));
        else for (; i < F; i++) st(out, t * F + i, 0, silu_mul1(ld(gu, t * sg + i, 0), ld(gu, t * sg + F + i, 0)));
    }
    return 0;
}
