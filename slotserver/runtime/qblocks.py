"""GGUF block formats as raw bytes: the `QWeight` a quantized matmul reads, the format table, a
dequantizer (gguf's own, tile by tile) and a builder of valid random blocks for tests.

Why keep the raw bytes: llama.cpp computes on the quantized blocks directly (a 4-bit weight is
read as 4.5 bits per value, not 32), so a matmul weight can stay a zero-copy view of the mmap'd
GGUF file. Nothing here ever writes to `QWeight.raw` (it may be a read-only mapping).

Block layouts (ggml-common.h; "h" is a little-endian float16):
- Q4_0 `h d, u8 qs[16]` (18 B / 32): q = nibble - 8 (low nibbles are values 0..15, high 16..31)
- Q4_1 `h d, h m, u8 qs[16]` (20 B): d * nibble + m
- Q5_0 `h d, u32 qh, u8 qs[16]` (22 B): fifth bit of value j is bit j of qh, minus 16
- Q5_1 `h d, h m, u32 qh, u8 qs[16]` (24 B); Q8_0 `h d, i8 qs[32]` (34 B)
- Q2_K `u8 scales[16], u8 qs[64], h d, h dmin` (84 B / 256); Q3_K `u8 hmask[32], u8 qs[64],
  u8 scales[12], h d` (110 B); Q4_K `h d, h dmin, u8 scales[12], u8 qs[128]` (144 B);
  Q5_K `h d, h dmin, u8 scales[12], u8 qh[32], u8 qs[128]` (176 B); Q6_K `u8 ql[128],
  u8 qh[64], i8 scales[16], h d` (210 B).
- MXFP4 `u8 e, u8 qs[16]` (17 B / 32; gpt-oss's experts): kvalues_mxfp4[nibble] * 2^(e - 128),
  the E2M1 values doubled {0, 1, 2, 3, 4, 6, 8, 12, and negatives} times half the E8M0 scale
  (ggml's GGML_E8M0_TO_FP32_HALF: e < 2 give float32 denormals, 0xff gives 2^127, not NaN).
"""

from __future__ import annotations

import ctypes
import functools
import math
import mmap
import warnings
from dataclasses import dataclass

import gguf
import numpy as np
import torch

from slotserver.runtime import torch_dequant

T = gguf.GGMLQuantizationType
LEGACY = (T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0)          # blocks of 32, activations as q8_0/q8_1
KQUANTS = (T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K)         # super-blocks of 256, activations as q8_K
FLOATS = {T.F32: torch.float32, T.F16: torch.float16, T.BF16: torch.bfloat16}
MICROSCALED = (T.MXFP4,)                                  # blocks of 32 with an E8M0 exponent, as q8_0
QUANTIZED = LEGACY + KQUANTS + MICROSCALED
# byte offsets of each block's float16 scale fields (what a random block must keep finite)
F16_FIELDS = {T.Q4_0: (0,), T.Q4_1: (0, 2), T.Q5_0: (0,), T.Q5_1: (0, 2), T.Q8_0: (0,),
              T.Q2_K: (80, 82), T.Q3_K: (108,), T.Q4_K: (0, 2), T.Q5_K: (0, 2), T.Q6_K: (208,)}
# largest |quant| per format (weights ~ d * this): sizes the random scales so outputs stay O(1)
QMAX = {T.Q4_0: 8, T.Q4_1: 16, T.Q5_0: 16, T.Q5_1: 32, T.Q8_0: 128,
        T.Q2_K: 3 * 15, T.Q3_K: 4 * 32, T.Q4_K: 15 * 63, T.Q5_K: 31 * 63, T.Q6_K: 32 * 128, T.MXFP4: 12}
TILE_BYTES = 8 << 20   # float32 bytes of dequantized weight alive at once in the tiled paths


@dataclass(frozen=True)
class QWeight:
    """A GGUF weight `W[n, k]` in its raw block bytes: `raw` is uint8 `[n, row_bytes]` with unit
    column stride (any row stride: a view into a mapped file is fine), `qtype` a
    GGMLQuantizationType value. `y = x @ W^T` is what `kernels/qmatmul.py` computes."""

    raw: torch.Tensor
    qtype: int
    k: int
    n: int

    def __post_init__(self):
        block, size = gguf.GGML_QUANT_SIZES[T(self.qtype)]
        assert self.k % block == 0, f"{T(self.qtype).name}: k={self.k} is not a multiple of {block}"
        assert self.raw.dtype == torch.uint8 and tuple(self.raw.shape) == (self.n, self.k // block * size), \
            f"raw must be uint8 [{self.n}, {self.k // block * size}], got {self.raw.dtype} {tuple(self.raw.shape)}"

    @property
    def name(self) -> str:
        return T(self.qtype).name

    def float_view(self) -> torch.Tensor:
        """F32/F16/BF16 rows as a `[n, k]` tensor of that dtype (no copy)."""
        return self.raw.view(FLOATS[T(self.qtype)])


def row_bytes(qtype: int, k: int) -> int:
    block, size = gguf.GGML_QUANT_SIZES[T(qtype)]
    return k // block * size


def tile_rows(k: int) -> int:
    """Rows of W dequantized at once in the tiled paths (bounded memory: TILE_BYTES of float32)."""
    return max(1, TILE_BYTES // (4 * k))


def dequantize(w: QWeight, n0: int = 0, n1: int | None = None) -> torch.Tensor:
    """Rows [n0, n1) of W as float32 `[rows, k]`, by gguf's numpy dequantizers (the reference)."""
    raw = w.raw[n0:n1].cpu().numpy()
    return torch.from_numpy(np.ascontiguousarray(gguf.quants.dequantize(raw, T(w.qtype)), dtype=np.float32))


def random_qweight(gen: torch.Generator, qtype: int, n: int, k: int) -> QWeight:
    """Valid random blocks: random quant bytes, finite float16 scales sized so that `x @ W^T` with
    unit-variance x has outputs of order 1 (scale ~ 1 / (qmax * sqrt(k)), signs random for mins)."""
    qtype = T(qtype)
    rb = row_bytes(qtype, k)
    if qtype in FLOATS:
        w = torch.randn(n, k, generator=gen) / k ** 0.5
        return QWeight(w.to(FLOATS[qtype]).view(torch.uint8).reshape(n, rb).clone(), int(qtype), k, n)
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    raw = torch.randint(0, 256, (n * k // block, size), generator=gen, dtype=torch.uint8)
    base = 2.0 / (QMAX[qtype] * k ** 0.5)
    if qtype == T.MXFP4:   # the E8M0 exponent: 2^(e-128) within a factor 2 either side of base
        e = 128 + round(math.log2(base)) + torch.randint(-1, 2, (raw.shape[0],), generator=gen)
        raw[:, 0] = e.to(torch.uint8)
        return QWeight(raw.reshape(n, rb), int(qtype), k, n)
    for i, off in enumerate(F16_FIELDS[qtype]):
        scale = base * (0.5 + torch.rand(raw.shape[0], generator=gen))
        if i == 1 and qtype in (T.Q4_1, T.Q5_1):   # a min: signed, of the size of the values
            scale = scale * QMAX[qtype] * (torch.rand(raw.shape[0], generator=gen) - 0.5)
        raw[:, off:off + 2] = scale.to(torch.float16).view(torch.uint8).reshape(-1, 2)
    return QWeight(raw.reshape(n, rb), int(qtype), k, n)


def from_mapped(data: np.ndarray, qtype: int, shape: tuple[int, int]) -> QWeight:
    """A QWeight over a GGUF tensor's bytes as `gguf.GGUFReader` maps them (`tensor.data`): no copy.

    `data` may be read-only (the file's mapping); torch then warns that writes would be undefined,
    which is why nothing here writes `raw`. shape: `(n, k)` in values (numpy order)."""
    n, k = shape
    flat = data.reshape(-1).view(np.uint8) if data.dtype != np.uint8 else data.reshape(-1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)   # "The given NumPy array is not writable"
        raw = torch.from_numpy(flat)
    return QWeight(raw.view(n, row_bytes(qtype, k)), int(qtype), k, n)


def experts_from_mapped(data: np.ndarray, qtype: int, shape: tuple[int, int, int]) -> list[QWeight]:
    """One QWeight per expert of a 3-D GGUF tensor `[n_expert, n, k]` (numpy order; ggml's
    `ffn_*_exps` tensors, MXFP4 in gpt-oss): expert e is the zero-copy view of its `[n, k]` slice,
    a 2-D weight like any other. Why one QWeight each: qmatmul caches its repacked form on the
    QWeight at its first call, so only the experts a prompt routes to are ever repacked."""
    n_expert, n, k = shape
    flat = from_mapped(data, qtype, (n_expert * n, k))   # [n_expert * n, row_bytes]
    return [QWeight(flat.raw[e * n:(e + 1) * n], flat.qtype, k, n) for e in range(n_expert)]


def block_size(qtype: int) -> int:
    """Columns one block of `qtype` spans (1 for the float formats)."""
    return gguf.GGML_QUANT_SIZES[T(qtype)][0]


def take_cols(w: QWeight, c0: int, c1: int) -> QWeight:
    """Input columns [c0, c1) of W (a copy), both on W's block boundaries (--tp's row-parallel slices)."""
    block, size = gguf.GGML_QUANT_SIZES[T(w.qtype)]
    assert c0 % block == 0 and c1 % block == 0, f"columns {c0}:{c1} cut {block}-wide blocks"
    return QWeight(w.raw[:, c0 // block * size: c1 // block * size].contiguous(), w.qtype, c1 - c0, w.n)


def take_rows(w: QWeight, rows: list[int] | torch.Tensor) -> QWeight:
    """Rows of W in the given order (a copy of just those rows' bytes: blocks never span rows).
    The copy replaces W (a load-time permutation): W's file pages are released."""
    idx = torch.as_tensor(rows, dtype=torch.long)
    out = QWeight(w.raw.index_select(0, idx), w.qtype, w.k, len(idx))
    release_file_pages(w.raw)
    return out


def concat_rows(parts: list[QWeight]) -> QWeight:
    """One QWeight of the parts' rows, stacked (same format and k): a copy of their bytes, which
    replaces the parts (a load-time fusion, q|k|v or gate|up): their file pages are released."""
    first = parts[0]
    assert all(p.qtype == first.qtype and p.k == first.k for p in parts), "concat_rows: mixed formats"
    out = QWeight(torch.cat([p.raw for p in parts]), first.qtype, first.k, sum(p.n for p in parts))
    for p in parts:
        release_file_pages(p.raw)
    return out


def get_rows(w: QWeight, idx: torch.Tensor) -> torch.Tensor:
    """Rows `idx` of W as float32 `[len(idx), k]`: only those rows are read and dequantized
    (an embedding lookup; llama.cpp's GET_ROWS)."""
    raw = w.raw.index_select(0, idx.to(torch.long).flatten())
    if T(w.qtype) in FLOATS:
        return raw.view(FLOATS[T(w.qtype)]).float()
    if not raw.is_cpu and torch_dequant.ported(w.qtype):   # on the GPU (--gpu-weights blocks): torch ops there
        return torch_dequant.dequantize(raw, w.qtype, w.k)
    if w.qtype == T.Q8_0:   # d * q in float32, as gguf's dequantizer: ~20 us a decode step against its ~300
        blocks = raw.view(raw.shape[0], w.k // 32, 34)                               # [rows, blocks, 2 + 32]
        d = blocks[:, :, :2].contiguous().view(torch.float16).float()              # [rows, blocks, 1]
        return (blocks[:, :, 2:].view(torch.int8).float() * d).view(raw.shape[0], w.k)
    return dequantize(QWeight(raw, w.qtype, w.k, raw.shape[0]))


def release_file_pages(raw: torch.Tensor) -> bool:
    """Drop this process's resident pages of `raw` where it is a read-only view of a mapped file
    (madvise DONTNEED: a later read faults them back in from the file, so nothing can change).
    Anonymous memory (a copy) is left alone: DONTNEED would zero it. Why: a repacked weight, or a
    load-time copy (take_rows, concat_rows), beside its source's file pages counted twice in RSS
    (a 1B model would hold ~2x its file). -> whether released."""
    start = raw.data_ptr()
    end = start + raw.untyped_storage().nbytes() - raw.storage_offset() * raw.element_size()
    page = mmap.PAGESIZE
    lo, hi = -(-start // page) * page, end // page * page
    if hi <= lo or not _in_file_mapping(start, end):
        return False
    return _libc().madvise(ctypes.c_void_p(lo), ctypes.c_size_t(hi - lo), 4) == 0   # MADV_DONTNEED


def _in_file_mapping(start: int, end: int) -> bool:
    """[start, end) lies in one read-only mapping of a regular file (/proc/self/maps)."""
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                parts = line.split(maxsplit=5)
                a, b = (int(v, 16) for v in parts[0].split("-"))
                if a <= start and end <= b:
                    return len(parts) == 6 and parts[5].startswith("/") and "w" not in parts[1]
    except OSError:
        pass
    return False


@functools.cache
def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    return libc
