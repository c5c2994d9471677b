"""kernels/qmatmul.c's library and the repacked form each format takes on this CPU, for the two ops
that run it: kernels/qmatmul.py (the GGUF matmul) and kernels/moe_matmul.py (the experts' matmul,
whose C calls qmatmul_r16 through a pointer, `R16_FN`). One build (the same name and origin: one
compiled library) and one table of forms, not a copy of each in both. Each op keeps its own names
for them (qmatmul's `NATIVE_C` / `_LIB`: the native contract; a test sets `_LIB = None` there for the
torch forms). A part of both modules (runtime/kernel_parts.py): a saved qmatmul.c or edit here
re-validates and swaps both.
"""

from __future__ import annotations

from slotserver.runtime import native
from slotserver.runtime.qblocks import T

# The C (kernels/qmatmul.c): the integer dots, the repacked forms, the dequantizer and the prologue.
NATIVE_C = native.c_source(__file__, "qmatmul.c")
LIB = native.build("qmatmul", NATIVE_C, origin=native.c_path(__file__, "qmatmul.c"), strict=True)
native.signature(LIB, "qmatmul", 3, 7, (native.ctypes.c_int,) * 5, replay=True)
native.signature(LIB, "qdequant", 2, 5, (native.ctypes.c_int,) * 3)
native.signature(LIB, "qrepack", 3, 4, (native.ctypes.c_int,) * 3)
native.signature(LIB, "qmatmul_r16", 5, 5, (native.ctypes.c_float,) + (native.ctypes.c_int,) * 8, replay=True)
native.signature(LIB, "qprologue", 3, 3, (native.ctypes.c_float,) + (native.ctypes.c_int,) * 4, replay=True)
native.signature(LIB, "qmatmul_r16_serves", 0, 0, (native.ctypes.c_int,) * 2)
native.signature(LIB, "qform_bytes", 0, 0, (native.ctypes.c_int,) * 2)
# The repacked form each format runs on here (see FORM_NIB in the C): the first this CPU serves of
# its preferred forms, the 4/5-bit ones first (fewer bytes than the byte form 0).
FORM_PREFERENCE = {T.Q4_0: (1, 0), T.Q4_1: (1, 0), T.Q5_0: (3, 0), T.Q5_1: (3, 0), T.Q8_0: (6, 0),
                   T.Q4_K: (4, 0), T.Q5_K: (5, 0), T.Q6_K: (7, 2), T.MXFP4: (8, 5, 0)}
R16_FORM = {} if LIB is None else {
    t: next(f for f in forms if LIB.qmatmul_r16_serves(int(t), f))
    for t, forms in FORM_PREFERENCE.items() if any(LIB.qmatmul_r16_serves(int(t), f) for f in forms)}
R16_FN = 0 if LIB is None else native.ctypes.cast(LIB.qmatmul_r16.fn, native.ctypes.c_void_p).value   # moe_matmul.c calls it
# Formats whose repacked value is d * (u - offset) (u unsigned, m = -offset * d): qmatmul_r16 on
# AVX-512 VNNI starts each block's integer sum at -offset * (the activation block's sum) instead of
# adding m * that sum with a second FMA: exact (one rounding fewer) and ~8% faster on 128 rows
# (Q5_0, one thread); every row count does the same, so a row's floats still do not depend on M.
R16_OFFSET = {T.Q4_0: 8, T.Q5_0: 16, T.Q8_0: 128, T.MXFP4: 12}
