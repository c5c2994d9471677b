/* row_join.c: join_rows of slotserver/model/row_join.py. Compiled with native.PRELUDE in front. */
#include <string.h>
/* out[t, h, :] = a[t, h, :na] then b[t, h, :nb], for t < T, h < H; elements of es bytes; a and b
   any token and head strides (in elements, 0 broadcasts), unit last stride; out contiguous. */
int join_rows(const char *a, const char *b, char *out, int64_t T, int64_t H, int64_t na, int64_t nb,
              int64_t sa_t, int64_t sa_h, int64_t sb_t, int64_t sb_h, int es) {
    for (int64_t t = 0; t < T; t++)
        for (int64_t h = 0; h < H; h++) {
            char *o = out + ((t * H + h) * (na + nb)) * es;
            memcpy(o, a + (t * sa_t + h * sa_h) * es, na * es);
            memcpy(o + na * es, b + (t * sb_t + h * sb_h) * es, nb * es);
        }
    return 0;
}
