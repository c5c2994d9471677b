"""kernels/qmatmul.py's repacked weights (qmatmul_r16 in the C): a 32-block weight's 16-row vector
form, built on its first batched call (or its first one row, where that form serves one row) and
kept on its QWeight, and which row counts run on it. A part of qmatmul.py (runtime/kernel_parts.py).
"""

from __future__ import annotations

import gguf
import torch

from slotserver.runtime import kernel_parts
from slotserver.runtime.qblocks import T, QWeight, release_file_pages

_qn = kernel_parts.load(__file__, "_qmatmul_native.py")
_LIB, _R16_FORM = _qn.LIB, _qn.R16_FORM
SMALL_Q8_0 = 1 << 20   # weights: below, Q8_0 runs repacked at one row too (see repacked_serves)


# Repacked 32-block weights for 2+ rows (see qmatmul_r16 in the C): built on a weight's first
# batched call and kept on that QWeight (so they live and die with the model that owns it), tagged
# with this module version's token: a reloaded qmatmul builds its own.
TOKEN = object()


def repacked(w: QWeight) -> tuple[torch.Tensor, torch.Tensor, int, int]:
    """(U, scales, form, min_rows) of a 32-block weight, see qmatmul_r16 in the C (FORM_NIB): in
    the 4-bit forms (1: Q4_0/Q4_1, 4: Q4_K) U is uint8 [groups, blocks, 4, 16, 4] nibbles, 0.625
    bytes per weight with the file's float16 scales [groups, blocks, 2, 16] (form 1), 0.75 with
    float32 ones (form 4); the 5-bit forms (3: Q5_0/Q5_1, 5: Q5_K) add a plane of fifth bits,
    Q6_K's (7) two planes with float16 d and int8 scales per 16 (0.875 bytes), MXFP4's (8) its
    file's nibbles and E8M0 bytes [groups, blocks, 16] (0.53 bytes); the byte forms (0,
    2 for Q6_K, where the CPU lacks the others) U [groups, blocks, 8, 16, 4] and float32 scales,
    1.25 bytes; Q8_0's (6) the same with only its float16 d, 1.0625 like the file. Both tensors are
    uint8 [groups, blocks, bytes] (`qform_bytes`).
    min_rows: the fewest rows it serves (`repacked_serves`)."""
    cached = w.__dict__.get("_qmatmul_r16")
    if cached is not None and cached[0] is TOKEN:
        return cached[1:]
    form = _R16_FORM[T(w.qtype)]
    u, sc, rc = _repack(w, form)
    if rc == 2:   # a min beyond float16 (Q4_0's -8 d, Q5_0's -16 d past 65504): the float32 form
        form = 0
        u, sc, rc = _repack(w, form)
    assert rc == 0, "qrepack failed"
    entry = (u, sc, form, 1 if _serves_one_row(w, form) else 2)
    object.__setattr__(w, "_qmatmul_r16", (TOKEN, *entry))   # a cache on a frozen dataclass
    if entry[3] == 1:   # every row count now reads the repacked copy: let the file's pages go
        release_file_pages(w.raw)
    return entry


def _repack(w: QWeight, form: int) -> tuple[torch.Tensor, torch.Tensor, int]:
    """(U, scales, qrepack's return code) of `w` in `form`, built now (no cache); both raw bytes
    whose layout the C defines (FORM_NIB)."""
    ng, nb = (w.n + 15) // 16, w.k // 32
    u = torch.empty(ng, nb, _LIB.qform_bytes(form, 0), dtype=torch.uint8)
    sc = torch.empty(ng, nb, _LIB.qform_bytes(form, 1), dtype=torch.uint8)
    rc = _LIB.qrepack(w.raw.data_ptr(), u.data_ptr(), sc.data_ptr(), w.n, w.k, w.raw.stride(0),
                      gguf.GGML_QUANT_SIZES[T(w.qtype)][1], w.qtype, form, torch.get_num_threads())
    return u, sc, rc


def repacked_serves(w: QWeight, rows: int) -> bool:
    """Whether `rows` activation rows run on the repacked form (their activations then quantized
    per 32 whatever the format): from 2 rows every format in _R16; one row where the form is
    compact (`_serves_one_row`)."""
    form = _R16_FORM.get(T(w.qtype))
    cached = w.__dict__.get("_qmatmul_r16")
    if cached is not None and cached[0] is TOKEN:
        form = cached[3]
    return form is not None and (rows >= 2 or _serves_one_row(w, form))


def _serves_one_row(w: QWeight, form: int) -> bool:
    """One decode row is bound by the bytes read: every form but Q8_0's float32 byte form (1.25
    bytes per weight against the file's 1.06, dotted per row straight from the file) serves it. The
    per-row unpacking of the 5-bit and K formats costs more than the extra bytes of the byte forms
    (SmolLM2 Q4_K_M, mostly Q5_0: b=1 73 -> 83 tok/s). Q8_0 with its float16 d (form 6, 1.0625
    bytes): SmolLM2's 49152 x 576 output matmul at one row, caches flushed, 1.03 ms (median of 40)
    against 1.60 per row from the file (and 1.14 in form 0). A small Q8_0 weight (a Q4_K_M file's
    attn_v part, 192 x 576) runs repacked in any form: there the bytes do not matter, and the
    repacked form fuses (one call instead of a prologue, the per-row dots and an add)."""
    return form != 0 or w.qtype != T.Q8_0 or w.n * w.k <= SMALL_Q8_0
