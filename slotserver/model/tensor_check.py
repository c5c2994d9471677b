"""`--check-tensors`: validate every tensor's data at load, as llama.cpp's flag of that name does.

Why: a GGUF whose weights hold NaN or inf loads fine, then every request fails (the logits are
NaN). llama.cpp's --check-tensors runs ggml_validate_row_data (ggml/src/ggml-quants.c) over each
tensor: float tensors (F32, F16, BF16, F64) must hold no NaN or inf; quantized ones no NaN or inf
in their blocks' scales (the float16 `d`, and `m`/`dmin` where the type has one; Q8_K's float32
`d`; IQ1_M's packed scale; MXFP4's exponent must not be 0xff), since every value of a block is
its integers times those scales. The same checks here, on the mapped bytes' bit patterns with
numpy, a chunk at a time so a large tensor needs no large temporary.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import gguf
import numpy as np

QT = gguf.GGMLQuantizationType
CHUNK_BYTES = 1 << 24

# float formats: (bytes, exponent mask, mantissa mask); all exponent bits set = inf (mantissa 0) or NaN
FLOATS = {QT.F32: (4, 0x7F800000, 0x007FFFFF), QT.F16: (2, 0x7C00, 0x03FF), QT.BF16: (2, 0x7F80, 0x007F),
          QT.F64: (8, 0x7FF0000000000000, 0x000FFFFFFFFFFFFF)}
# byte offsets of the float16 scales in one block (ggml-common.h's block structs)
F16_SCALES = {QT.Q4_0: (0,), QT.Q4_1: (0, 2), QT.Q5_0: (0,), QT.Q5_1: (0, 2), QT.Q8_0: (0,),
              QT.Q2_K: (80, 82), QT.Q3_K: (108,), QT.Q4_K: (0, 2), QT.Q5_K: (0, 2), QT.Q6_K: (208,),
              QT.IQ2_XXS: (0,), QT.IQ2_XS: (0,), QT.IQ2_S: (0,), QT.IQ3_XXS: (0,), QT.IQ3_S: (0,),
              QT.IQ1_S: (0,), QT.IQ4_NL: (0,), QT.IQ4_XS: (0,), QT.TQ1_0: (52,), QT.TQ2_0: (64,)}
if hasattr(QT, "Q1_0"):
    F16_SCALES[QT.Q1_0] = (0,)


@dataclass
class Count:
    """Non-finite units (elements of a float tensor, blocks of a quantized one) found so far."""
    nan: int = 0
    inf: int = 0
    first: int = -1


def _bits(blocks: np.ndarray, offset: int, width: int) -> np.ndarray:
    """The little-endian unsigned ints at bytes [offset, offset + width) of every block."""
    return np.ascontiguousarray(blocks[:, offset:offset + width]).view(f"<u{width}").ravel()


def _classify(bits: np.ndarray, exp: int, mant: int) -> tuple[np.ndarray, np.ndarray]:
    """(NaN mask, inf mask) of float bit patterns."""
    special = (bits & exp) == exp
    nan = special & ((bits & mant) != 0)
    return nan, special & ~nan


def _float_check(width: int, exp: int, mant: int) -> Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]]:
    return lambda blocks: _classify(_bits(blocks, 0, width), exp, mant)


def _scales_check(offsets: tuple[int, ...]) -> Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]]:
    def check(blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        masks = [_classify(_bits(blocks, off, 2), 0x7C00, 0x03FF) for off in offsets]
        nan = np.logical_or.reduce([m[0] for m in masks])
        return nan, np.logical_or.reduce([m[1] for m in masks]) & ~nan
    return check


def _iq1_m(blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """IQ1_M keeps its float16 scale in the top 4 bits of its four 16-bit scale words."""
    sc = [_bits(blocks, 48 + 2 * j, 2).astype(np.uint32) for j in range(4)]
    scale = (sc[0] >> 12) | ((sc[1] >> 8) & 0x00F0) | ((sc[2] >> 4) & 0x0F00) | (sc[3] & 0xF000)
    return _classify(scale, 0x7C00, 0x03FF)


def _mxfp4(blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    invalid = blocks[:, 0] == 0xFF   # an E8M0 exponent of 0xff is NaN
    return invalid, np.zeros_like(invalid)


CHECKS: dict[QT, Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]]] = {
    **{t: _float_check(*spec) for t, spec in FLOATS.items()},
    **{t: _scales_check(offs) for t, offs in F16_SCALES.items()},
    QT.Q8_K: _float_check(4, 0x7F800000, 0x007FFFFF), QT.IQ1_M: _iq1_m,
}
if hasattr(QT, "MXFP4"):
    CHECKS[QT.MXFP4] = _mxfp4


def count_nonfinite(data: np.ndarray, ggml_type: QT) -> Count:
    """NaN/inf units in a tensor's bytes (`data`, uint8), as ggml_validate_row_data sees them;
    a type it does not check (integers, NVFP4) counts none."""
    check, count = CHECKS.get(ggml_type), Count()
    if check is None:
        return count
    unit = gguf.GGML_QUANT_SIZES[ggml_type][1]
    step = max(1, CHUNK_BYTES // unit) * unit
    for start in range(0, len(data) - len(data) % unit, step):
        nan, inf = check(data[start:start + step].reshape(-1, unit))
        bad = nan | inf
        if count.first < 0 and bad.any():
            count.first = start // unit + int(np.argmax(bad))
        count.nan, count.inf = count.nan + int(nan.sum()), count.inf + int(inf.sum())
    return count


def describe(name: str, ggml_type: QT, count: Count) -> str:
    """One line naming the tensor and what is wrong in it."""
    what = " and ".join(f"{n} {kind}" for n, kind in ((count.nan, "NaN"), (count.inf, "inf")) if n)
    if ggml_type in FLOATS:
        return f"tensor {name} ({ggml_type.name}) holds {what} values, the first at element {count.first}"
    return (f"tensor {name} ({ggml_type.name}) has {what} block scales, "
            f"the first in block {count.first}")


def logits_problem(row) -> str | None:
    """Why a row of logits (a torch tensor, as the model produced it) cannot be sampled from, when
    the model is to blame: a NaN or +inf anywhere, or nothing but -inf. Then the cause is in the
    weights (or the kernels), not the request, and the message says how to find out. None otherwise
    (a logit_bias or grammar that forbids every token is the request's doing)."""
    import torch

    if bool(torch.isnan(row).any()):
        kind = "NaN"
    elif bool(torch.isposinf(row).any()) or bool(torch.isneginf(row).all()):
        kind = "infinite"
    else:
        return None
    return (f"the model produced {kind} logits, so no token can be sampled "
            "(the weights hold NaN or inf? start the server with --check-tensors to find the tensor)")
