/* step_graph.c: replay_calls, the replay loop of slotserver/model/step_graph.py. Compiled with
   native.PRELUDE (slotserver/runtime/prelude.h) in front; built on x86-64 Linux only.

   The replay loop in C: one ctypes call for the whole step instead of ~210 (each converting ~20
   arguments: ~0.6 ms a step at b=1 on a 2-core AVX2 host). Every recorded function is called
   through one prototype, its integer-class arguments (pointers, int64, int) in order, then its
   float ones: under the x86-64 System V convention that places each argument where the callee's
   own prototype expects it (the integer ones in rdi.. then on the stack in order, the floats in
   xmm0..), and the arguments it does not declare are ignored. Elsewhere the loop stays in Python. */
typedef int (*any_fn)(int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t,
                      int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t,
                      int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t,
                      float, float, float, float);
typedef struct { void *fn; int64_t a[28]; float f[4]; } Call;

/* calls[0..n) in order; -> 0, or the first nonzero return (its index in *failed). */
int replay_calls(const Call *calls, int64_t *failed, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        const Call *c = calls + i; const int64_t *a = c->a;
        const int rc = ((any_fn)c->fn)(a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8], a[9], a[10], a[11],
                                       a[12], a[13], a[14], a[15], a[16], a[17], a[18], a[19], a[20], a[21], a[22],
                                       a[23], a[24], a[25], a[26], a[27], c->f[0], c->f[1], c->f[2], c->f[3]);
        if (rc) { *failed = i; return rc; }
    }
    return 0;
}
