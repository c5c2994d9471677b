"""A model's matmul weights: `QLinear` (GGUF blocks, the default) and `Linear` (dequantized formats).

`QLinear` keeps the file's quantized blocks (`QWeight`, a view of the mapped file) and calls the
serving `qmatmul` kernel of the model's KernelSet: llama.cpp's way (integer dots on the blocks
for few rows, dequantized tiles + GEMM for many; see kernels/qmatmul.py). Its parts are
concatenated along `out` (q|k|v in one call where they share a format).

`Linear` is the dequantized path: `--weights dense` (and float32's exact reference mode), `int8`,
`int4`, and their mixes with dense (`auto8`, formerly `auto`; `auto4`). On CPU a decode step with
few tokens is bound by reading (and unpacking) the weights, so weight-only int8 / int4 matmuls win there; with many tokens the matmul is compute-bound and the
dense bf16 (or f32) GEMM wins. `Linear` keeps the formats it was asked for and picks per call by
the number of rows (thresholds in `WeightFormat`, measured in docs/performance.md): for int4
layers torch's kernel at 1-2 rows, the AMX kernel (kernels/q4_matmul.py, via the KernelSet) up to
`q4n_max_rows` where the CPU has AMX, torch's int4 up to `int8_max_rows` where it has not, dense
above. The int8 copy (`torch._weight_int8pack_mm`, per-row scales) is a per-row absmax
re-quantization of the dequantized GGUF weight. The int4 copies (asymmetric groups of 32:
w = d * q + m) are an exact re-encoding of Q4_1 weights: ggml's Q4_1 block of 32 spans [min, max]
with q in 0..15, so re-quantizing the dequantized block by its own min/max recovers the same q,
d and m.
"""

from __future__ import annotations

import functools

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from slotserver.runtime import cpu_features
from slotserver.model.bias_add import add_bias
from slotserver.runtime.qblocks import QWeight

WEIGHT_FORMATS = ("dense", "int8", "int4", "auto8", "auto4")   # Linear's; "auto" was renamed "auto8"
INT4_GROUP = 32
PACK_ROWS_HINT = 32
NATIVE_MIN_ROWS = 3   # below, torch's int4 kernel is as fast (one pass over 4 rows); see docs/performance.md


@dataclass
class Linear:
    dense: torch.Tensor | None          # [out, in] compute dtype
    bias: torch.Tensor | None           # [out]
    q8: torch.Tensor | None = None      # [out, in] int8
    q8_scale: torch.Tensor | None = None  # [out] compute dtype
    int8_max_rows: int = 0
    q4: torch.Tensor | None = None      # packed int4 (torch's CPU layout)
    q4_scale_zero: torch.Tensor | None = None  # [in / 32, out, 2] bf16
    packed: torch.Tensor | None = None  # [out, in] bf16 in oneDNN's blocked layout (replaces `dense`)
    q4n: torch.Tensor | None = None     # int4 in kernels/q4_matmul.py's layout (AMX kernel), same groups as q4
    q4n_dz: torch.Tensor | None = None  # its float32 scales
    q4n_max_rows: int = 0               # rows from NATIVE_MIN_ROWS up to this use the AMX kernel

    def __post_init__(self) -> None:
        if self.dense is not None and self.packed is None:
            self.packed = _prepack(self.dense)
            if self.packed is not None:
                self.dense = None

    @classmethod
    def build(cls, w: torch.Tensor, bias: torch.Tensor | None, fmt: str, int8_max_rows: int,
              native_max_rows: int = 0, q4_kernel=None) -> "Linear":
        """w: [out, in] in the compute dtype. fmt: dense | int8 / int4 (only) | auto8 / auto4 (both).
        With int4 formats, `native_max_rows` > 0 and `q4_kernel` (the kernels/q4_matmul.py module)
        available here, also the AMX kernel's copy."""
        assert fmt in WEIGHT_FORMATS, fmt
        if fmt == "dense" or int8_max_rows <= 0:
            return cls(w, bias)
        if fmt in ("int4", "auto4") and (w.shape[1] % INT4_GROUP or w.shape[0] % 16):
            fmt = "int8" if fmt == "int4" else "auto8"  # torch's int4 packing needs these multiples
        if fmt in ("int4", "auto4"):
            q, d, lo = _int4_groups(w)
            q4, sz = _pack_int4(q, d, lo)
            dense = w if fmt == "auto4" else None
            rows = int8_max_rows if fmt == "auto4" else 1 << 30
            native = {}
            if native_max_rows > 0 and q4_kernel is not None and q4_kernel.available():
                w4, dz = q4_kernel.pack(q, d, lo)
                native = dict(q4n=w4, q4n_dz=dz, q4n_max_rows=native_max_rows if fmt == "auto4" else 1 << 30)
            return cls(dense, bias, int8_max_rows=rows, q4=q4, q4_scale_zero=sz, **native)
        scale = (w.float().abs().amax(dim=1) / 127.0).clamp_min(1e-12)   # [out]
        q = torch.round(w.float() / scale[:, None]).clamp_(-127, 127).to(torch.int8)
        dense = w if fmt == "auto8" else None
        rows = int8_max_rows if fmt == "auto8" else 1 << 30
        return cls(dense, bias, q.contiguous(), scale.to(w.dtype), rows)

    @property
    def out_features(self) -> int:
        if self.dense is not None or self.packed is not None:
            return (self.dense if self.dense is not None else self.packed).shape[0]
        return (self.q8 if self.q8 is not None else self.q4_scale_zero.transpose(0, 1)).shape[0]

    def __call__(self, x: torch.Tensor, ops=None) -> torch.Tensor:
        """x: [rows, in] -> [rows, out]. ops: the model's KernelSet (needed for the AMX int4 copy)."""
        if self.q4n is not None and NATIVE_MIN_ROWS <= x.shape[0] <= self.q4n_max_rows:
            y = ops.q4_matmul(x.to(torch.bfloat16), self.q4n, self.q4n_dz).to(x.dtype)
            return y if self.bias is None else y + self.bias
        if self.q4 is not None and x.shape[0] <= self.int8_max_rows:
            y = torch._weight_int4pack_mm_for_cpu(x.to(torch.bfloat16), self.q4, INT4_GROUP, self.q4_scale_zero)
            y = y.to(x.dtype)
            return y if self.bias is None else y + self.bias
        if self.q8 is not None and x.shape[0] <= self.int8_max_rows:
            y = torch._weight_int8pack_mm(x.to(self.q8_scale.dtype), self.q8, self.q8_scale)
            return y if self.bias is None else y + self.bias
        if self.packed is not None:
            return torch.ops.mkldnn._linear_pointwise(x.contiguous(), self.packed, self.bias, "none", [], "")
        return F.linear(x, self.dense, self.bias)

    def nbytes(self) -> int:
        parts = (self.dense, self.packed, self.bias, self.q8, self.q8_scale, self.q4, self.q4_scale_zero,
                 self.q4n, self.q4n_dz)
        return sum(t.numel() * t.element_size() for t in parts if t is not None)


@dataclass
class QLinear:
    """`y = x @ W^T (+ bias)` with W the row-concatenation of `parts`, each GGUF blocks (`QWeight`),
    computed by the KernelSet's `op`: `qmatmul` on the CPU, `qmatmul_gpu` for blocks on a CUDA
    card (model/gpu_weights.py; timed, validated, hot-reloadable like every kernel).

    Several parts only where formats differ (e.g. a Q4_K_M file's Q6_K attn_v beside Q4_K q/k):
    one call per part, outputs concatenated."""

    parts: list[QWeight]
    bias: torch.Tensor | None = None    # [out] float32
    op: str = "qmatmul"                 # the kernel op that multiplies the blocks

    @property
    def out_features(self) -> int:
        return sum(p.n for p in self.parts)

    def __call__(self, x: torch.Tensor, ops, x_q8: tuple | None = None) -> torch.Tensor:
        """x: [rows, in] float32 or bf16 -> [rows, out] in x's dtype. x_q8: x's q8_1, for an op that
        reads it (qmatmul_gpu's FUSES; model/lean_step.py): every part's product then reads it."""
        x = x.contiguous()
        mm, parts = getattr(ops, self.op), self.parts
        if x_q8 is not None:
            mm = functools.partial(mm, x_q8=x_q8)
        y = mm(x, parts[0]) if len(parts) == 1 else torch.cat([mm(x, p) for p in parts], dim=1)
        return y if self.bias is None else y + self.bias.to(y.dtype)

    def fused(self, x: torch.Tensor, ops, norm: torch.Tensor | None, eps: float, glu: bool,
              acc: torch.Tensor | None) -> torch.Tensor:
        """The same product with qmatmul's fusions (kernels/qmatmul.py: x RMS-normed by `norm`, or
        x = gate|up through silu * up; the output added into `acc`); only for a qmatmul with FUSES.
        Several parts: each fuses the prologue (a row's norm costs ~0.1 us), the add comes after.
        qmatmul_gpu fuses only the add: the prologue runs as the silu_mul / rms_norm kernels (one
        launch each on a GPU, where launches, not Python round trips, are the cost)."""
        if self.op != "qmatmul":
            return self._gpu_fused(x, ops, norm, eps, glu, acc)
        x = x.contiguous()
        parts = self.parts
        if len(parts) == 1 and self.bias is None:
            return ops.qmatmul(x, parts[0], norm, eps, glu, acc)
        if len(parts) == 1:
            y = ops.qmatmul(x, parts[0], norm, eps, glu)
        else:   # each part adds into its columns of zeros: no per-part tensors, no concatenation
            y, n0 = torch.zeros(x.shape[0], self.out_features, dtype=x.dtype, device=x.device), 0
            for p in parts:
                ops.qmatmul(x, p, norm, eps, glu, y[:, n0: n0 + p.n])
                n0 += p.n
        y = y if self.bias is None else add_bias(y, self.bias)   # in C: a step graph records it
        return y if acc is None else acc.add_(y)

    def _gpu_fused(self, x: torch.Tensor, ops, norm: torch.Tensor | None, eps: float, glu: bool,
                   acc: torch.Tensor | None) -> torch.Tensor:
        """`fused` for an op that fuses only `acc` (qmatmul_gpu): prologue kernels, then the product."""
        dtype = x.dtype
        if glu:
            x = ops.silu_mul(x)
        if norm is not None:
            x = ops.rms_norm(x, norm, eps)
        x = x.to(dtype).contiguous()
        if len(self.parts) == 1 and self.bias is None and acc is not None:
            return getattr(ops, self.op)(x, self.parts[0], acc)
        y = self(x, ops)
        return y if acc is None else acc.add_(y)

    def nbytes(self) -> int:
        """Bytes of the blocks (views of the mapped file count: they are what a step reads)."""
        b = 0 if self.bias is None else self.bias.numel() * self.bias.element_size()
        return b + sum(p.raw.shape[0] * p.raw.shape[1] for p in self.parts)


def _prepack(w: torch.Tensor) -> torch.Tensor | None:
    """A bf16 weight re-blocked once, at load, for oneDNN's GEMM; None where that is unavailable.

    Why: `F.linear` re-blocks the weight on every call. Measured on this CPU over 30 weights of one
    layer shape (so they come from memory, as in the model): 1.4-1.6x faster per matmul at 1 to
    512 rows, bit-identical results. The row hint only tunes the blocking; any row count works.
    Only where oneDNN runs bf16 natively (AVX-512 BW/VL/DQ, not under SLOTSERVER_CPU=avx2):
    elsewhere torch refuses the re-blocking and F.linear serves (`prepack_available`).
    """
    if w.dtype != torch.bfloat16 or w.device.type != "cpu" or not prepack_available():
        return None
    try:
        return torch.ops.mkldnn._reorder_linear_weight(w.contiguous(), PACK_ROWS_HINT)
    except (RuntimeError, AttributeError):  # a torch build without oneDNN's linear ops
        return None


def prepack_available() -> bool:
    """Whether bf16 weights get oneDNN's pre-packed copy on this CPU (variant included)."""
    if not (torch.backends.mkldnn.is_available() and cpu_features.current().onednn_bf16):
        return False
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())  # torch's own CPU test (and ONEDNN_MAX_CPU_ISA)
    except (RuntimeError, AttributeError):
        return False


def _int4_groups(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Asymmetric 4-bit groups of 32 along `in`, w = d * q + lo: -> q [out, in] int32 in 0..15, d, lo [out, in/32]."""
    out_f, in_f = w.shape
    g = w.float().view(out_f, in_f // INT4_GROUP, INT4_GROUP)
    lo, hi = g.amin(-1), g.amax(-1)                                   # [out, groups]
    d = ((hi - lo) / 15).clamp_min(1e-12)
    q = torch.round((g - lo[..., None]) / d[..., None]).clamp_(0, 15).to(torch.int32)
    return q.view(out_f, in_f), d, lo


def _pack_int4(q: torch.Tensor, d: torch.Tensor, lo: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """-> (torch's packed int4 weight, [in/32, out, 2] bf16 scale|zero) for `_weight_int4pack_mm_for_cpu`."""
    packed = torch._convert_weight_to_int4pack_for_cpu(q, 1)
    scale_zero = torch.stack([d.t(), (lo + 8 * d).t()], dim=-1).to(torch.bfloat16).contiguous()
    return packed, scale_zero
