"""qmatmul: `y[M, N] = x[M, K] @ W^T` with W a GGUF-quantized weight kept in its raw block bytes
(`slotserver.runtime.qblocks.QWeight`, possibly a read-only view of the mapped file), llama.cpp's MUL_MAT.

How `cpu` computes (what llama.cpp's CPU backend does):
- each activation row is quantized to 8 bits: per block of 32 (`q8_0`, with the block's integer
  sum, `q8_1` style, for formats with an offset) for Q4_0/Q4_1/Q5_0/Q5_1/Q8_0, per super-block of
  256 with sums per 16 (`q8_K` with `bsums`) for Q2_K..Q6_K. Scales are float32, symmetric
  (d = amax / 127, q = round-half-even(x / d)); llama.cpp stores q8_0's d as float16 and takes
  q8_K's sign from the largest value: ours is a little more accurate, same speed.
- each weight row is unpacked once into unsigned quants (0..63; Q8_0 stays signed) with integer
  sub-block scales/mins, so that every format is `value = d*sc*u - dmin*mn` (Q4_0's -8, Q6_K's -32
  and Q3_K's -4 offsets are mins: their integer part uses the activation sums), then dotted with
  every activation row: `_mm256_maddubs_epi16` + `_mm256_madd_epi16` (AVX2), `_mm256_dpbusd_epi32`
  (AVX-512 VNNI + VL) for the 32-blocks, plain C elsewhere; exact int32 per block, scaled and
  summed in float32. OpenMP over output rows (W is read once per call, whatever M).
- the repacked forms (`qrepack`, `qmatmul_r16`: built on a weight's first call, kept on its
  QWeight): a 32-block of 16 weight rows becomes 8 vectors of 64 bytes, vector t holding values
  4t..4t+3 of every row, so one `vpdpbusd` (or `maddubs` + `madd` on AVX2) makes 4 products for
  16 output rows against the activation's 4 bytes broadcast, and the block's scales cost one
  convert and two FMAs per 16 outputs; the 8 weight vectors stay in registers while 16 activation
  rows pass. Q4_0/Q4_1 keep 4-bit nibbles and float16 scales (the file's 0.625 bytes per weight),
  Q5_0/Q5_1 add a plane of fifth bits (0.75), Q4_K/Q5_K the same with float32 scales per 32 (0.75 /
  0.875: a K super-block's d*sc is exact in float32, not in float16); with AVX-512 VNNI Q8_0 bytes
  with only a float16 d (1.0625, as the file) and Q6_K nibbles plus two bit planes (0.875), else bytes with float32
  scales (1.25; Q6_K one per 16). The forms per CPU: `_R16_FORM`, from the C's FORM_NIB comment.
  This serves every row count for those formats (one decode row included, except Q8_0 in the
  1.25-byte form, whose own bytes are then dotted straight from the file): 2-4x the per-row dots
  from 2 rows, and faster than dequantized tiles + oneDNN's bf16 GEMM up to 512 rows (470-576 vs
  380-430 GFLOP/s). On AVX2, 2+ rows of a block run as 2-row register tiles over the block's
  values unpacked once for a pass of up to 64 rows (`r16_block_tiles_avx2`,
  `r16_block_q8_tiles_avx2`; Q6_K's byte form keeps the per-row loop): on an AVX2-only Zen 3,
  one thread, Q4_K 1536 x 768 at 8 / 32 rows went from 107 / 117 to 155 / 179 GFLOP/s with the
  vector amax in quantize_row, and the integer path beats float32 tiles + torch's GEMM at every
  row count measured (1-128), so PREFILL_ROWS only matters for Q2_K/Q3_K there. A model's
  weights do not fit L3 and stream from DRAM: the loop prefetches 16 (group, block)s ahead on a
  group's first pass of rows (`r16_prefetch`; from 8 rows the hardware prefetcher alone had left it
  waiting, 1.3-2.5x slower; `qmatmul_bench.py --cold` measures it that way). On AVX-512 VNNI,
  from 32 rows (prefill, decode of 32+) a thread unpacks two groups of 16 rows once into a byte
  buffer and passes 6 activation rows at a time over it with the 12 sums in registers
  (`t512_tile`: a broadcast feeds two dpbusd; every form but Q6_K's), and Q4_0/Q5_0/Q8_0's
  constant offset starts each block's integer sum (`R16_OFFSET`) instead of a second FMA: 2
  threads, weights from DRAM, 1.04-1.37x at 32-512 rows (Zen 5; docs/performance.md, ninth
  round); a row's floats are the same at every M.
- MXFP4 (gpt-oss's experts, an E8M0 exponent per 32): unpacked as u = kvalue + 12 (0..24) with
  m = -12 d, a 32-block like Q4_0 (the AVX paths look the nibbles' values up with one vpshufb);
  repacked in its own form 8: the file's nibbles and E8M0 bytes (0.53 bytes per weight), looked
  up (vpshufb) and decoded in the kernel into the byte values and float32 d, m = -12 d of the
  other forms (Q5_K's 5-bit form 5 and the byte form 0 serve it too: the same floats), the offset
  folded into the integer sums on AVX-512 VNNI (R16_OFFSET), so the product is ggml's
  d_w * d_x * sum(kvalue * q) with a float32 d_x for ggml's float16.
- Q2_K/Q3_K: per-row dots below
  `PREFILL_ROWS[qtype]` rows, above it tiles of W dequantized by the same unpacking into float32 /
  bf16 and multiplied by torch (`playground/qmatmul_bench.py` measures the crossover).
No compiler (or SLOTSERVER_NATIVE=0): gguf's dequantizer, tile by tile, then torch.

TOL: the only approximation is the 8-bit activation (and, from PREFILL_ROWS on, bf16 tiles); on
the repacked forms the K formats' activations are quantized per 32, not per 256 (finer).
Measured against the exact float64 product (M=64, N=256, unit-variance x): relative RMS error
0.53% for the 32-blocks, 0.65-0.73% for the 256-blocks, worst element 2-5% of the output RMS;
llama.cpp's own q8_0 (float16 d) / q8_K (signed max) gives the same numbers to 2 digits. The
example inputs have outputs of RMS ~1-2, so TOL (|err| <= tol * (1 + |ref|)) is 3e-2 in float32
and 4e-2 in bf16 (its output rounding, 2^-9 relative, on top). The integer path itself is checked
100x tighter against a Python model of the same quantization (tests/test_qmatmul.py).
"""

from __future__ import annotations

from collections.abc import Callable

import gguf
import torch
import torch.nn.functional as F
import triton as _triton
import triton.language as tl

from slotserver.runtime import cpu_features

from slotserver.runtime import native
from slotserver.runtime.qblocks import FLOATS, T, QWeight, dequantize, random_qweight, release_file_pages, tile_rows

OP = "qmatmul"
TOL = {torch.float32: 3e-2, torch.bfloat16: 4e-2}
# rows from which the dequantize-a-tile + torch GEMM path beats the integer dots: measured by
# playground/qmatmul_bench.py (1 thread, AVX-512 VNNI + BF16 host, SmolLM2-135M / 0.5B shapes);
# the 32-block int path stays near 15-25 GFLOP/s whatever M, the K-quants' near 40-50
# Q4_0/Q4_1/Q5_0 from 16, not 8, since the 32-block dots serve 8 rows per pass (QM_ROWS): in the
# SmolLM2 Q4_1 model at decode b=8 (2 threads, AVX-512 VNNI + BF16), 70 ms per step on the integer
# path vs 109 ms on tiles; at b=16 the two tie (128 vs 137 ms, tiles ahead)
PREFILL_ROWS = {int(T.Q4_0): 64, int(T.Q4_1): 64, int(T.Q5_0): 64, int(T.Q5_1): 64, int(T.Q8_0): 64,
                int(T.Q2_K): 16, int(T.Q3_K): 16, int(T.Q4_K): 16, int(T.Q5_K): 32, int(T.Q6_K): 16,
                int(T.MXFP4): 64}
SMALL_Q8_0 = 1 << 20   # weights: below, Q8_0 runs repacked at one row too (see repacked_serves)


# Fusions (FUSES, optional arguments of every implementation): the model asks for them where a
# step would otherwise call rms_norm / silu_mul before the matmul and add its output to the
# residual after it. Why: at decode batch 1 each of those is a whole Python -> C round trip
# (~6-7 us, 90 per step, ~0.7 ms of a ~9 ms step) for ~0.1 us of arithmetic. A qmatmul module
# without FUSES is called unfused (the model checks), so an older lab copy keeps working.
FUSES = ("norm", "glu", "acc")


def reference(x: torch.Tensor, w: QWeight, norm: torch.Tensor | None = None, eps: float = 0.0, glu: bool = False,
              acc: torch.Tensor | None = None) -> torch.Tensor:
    """gguf's dequantizer, then a float32 matmul: x [M, K] -> [M, N] in x's dtype.
    Fused: glu (x is gate|up [M, 2K]: the input is silu(gate) * up), then `norm` (an RMSNorm
    weight [K], epsilon eps); acc [M, N]: the product is added into it, and it is returned."""
    x = _prologue_ref(x, norm, eps, glu)
    wf = dequantize(w) if w.qtype not in FLOATS else w.float_view().cpu().float()
    return _epilogue((x.cpu().float() @ wf.T).to(x.dtype).to(x.device), acc)


def _prologue_ref(x: torch.Tensor, norm: torch.Tensor | None, eps: float, glu: bool) -> torch.Tensor:
    """The fused input in torch: the silu_mul and rms_norm kernels' references."""
    if glu:
        g, u = x.float().chunk(2, dim=-1)
        x = (g / (1 + torch.exp(-g)) * u).to(x.dtype)
    if norm is not None:
        xf = x.float()
        x = (xf * torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + eps) * norm.float()).to(x.dtype)
    return x


def _epilogue(y: torch.Tensor, acc: torch.Tensor | None) -> torch.Tensor:
    if acc is None:
        return y
    return acc.add_(y if y.dtype == acc.dtype else y.to(acc.dtype))


# The C (kernels/qmatmul.c): the integer dots, the repacked forms, the dequantizer and the prologue.
NATIVE_C = native.c_source(__file__, "qmatmul.c")
_LIB = native.build("qmatmul", NATIVE_C, origin=native.c_path(__file__, "qmatmul.c"), strict=True)
native.signature(_LIB, "qmatmul", 3, 7, (native.ctypes.c_int,) * 5, replay=True)
native.signature(_LIB, "qdequant", 2, 5, (native.ctypes.c_int,) * 3)
native.signature(_LIB, "qrepack", 3, 4, (native.ctypes.c_int,) * 3)
native.signature(_LIB, "qmatmul_r16", 5, 5, (native.ctypes.c_float,) + (native.ctypes.c_int,) * 8, replay=True)
native.signature(_LIB, "qprologue", 3, 3, (native.ctypes.c_float,) + (native.ctypes.c_int,) * 4, replay=True)
native.signature(_LIB, "qmatmul_r16_serves", 0, 0, (native.ctypes.c_int,) * 2)
native.signature(_LIB, "qform_bytes", 0, 0, (native.ctypes.c_int,) * 2)
# The repacked form each format runs on here (see FORM_NIB in the C): the first this CPU serves of
# its preferred forms, the 4/5-bit ones first (fewer bytes than the byte form 0).
_FORM_PREFERENCE = {T.Q4_0: (1, 0), T.Q4_1: (1, 0), T.Q5_0: (3, 0), T.Q5_1: (3, 0), T.Q8_0: (6, 0),
                    T.Q4_K: (4, 0), T.Q5_K: (5, 0), T.Q6_K: (7, 2), T.MXFP4: (8, 5, 0)}
_R16_FORM = {} if _LIB is None else {
    t: next(f for f in forms if _LIB.qmatmul_r16_serves(int(t), f))
    for t, forms in _FORM_PREFERENCE.items() if any(_LIB.qmatmul_r16_serves(int(t), f) for f in forms)}
_R16 = frozenset(_R16_FORM)
_XDTYPES = (torch.float32, torch.bfloat16)
# Formats whose repacked value is d * (u - offset) (u unsigned, m = -offset * d): qmatmul_r16 on
# AVX-512 VNNI starts each block's integer sum at -offset * (the activation block's sum) instead of
# adding m * that sum with a second FMA: exact (one rounding fewer) and ~8% faster on 128 rows
# (Q5_0, one thread); every row count does the same, so a row's floats still do not depend on M.
R16_OFFSET = {T.Q4_0: 8, T.Q5_0: 16, T.Q8_0: 128, T.MXFP4: 12}
_BF16_GEMM = cpu_features.current().onednn_bf16 and cpu_features.current().variant != "other"


def cpu_path() -> str:
    """What `cpu` computes with here (shown in /props, /lab and `slotserver top`)."""
    if _LIB is None:
        return "torch (gguf dequantize + matmul)"
    feats = cpu_features.current()
    if feats.variant in ("avx512", "amx") and feats.has("avx512_vnni", "avx512vl"):
        dots = "AVX-512 VNNI dpbusd"
    elif feats.variant != "other":
        dots = "AVX2 maddubs"
    else:
        dots = "portable C"
    repacked = ", repacked 16-row vectors" if _R16 else ""
    return f"int8 dots {dots}{repacked}; Q2_K/Q3_K {'bf16' if _BF16_GEMM else 'f32'} tiles + GEMM from {min(PREFILL_ROWS.values())} rows"


def cpu(x: torch.Tensor, w: QWeight, norm: torch.Tensor | None = None, eps: float = 0.0, glu: bool = False,
        acc: torch.Tensor | None = None) -> torch.Tensor:
    """x [M, K] (float32 or bf16, unit last stride) -> [M, N] in x's dtype; fusions as `reference`.
    The repacked form fuses in C; other paths run the same C prologue, then the matmul, then add."""
    fast = w.__dict__.get("_qmatmul_r16")   # the served case, checked in few steps (a decode step makes ~120 calls)
    if fast is not None and fast[0] is _TOKEN and x.dtype == torch.float32 and x.is_contiguous() and x.is_cpu:
        m, k = x.shape if x.dim() == 2 else (0, 0)
        _, u, sc, form, min_rows = fast
        if k == (2 * w.k if glu else w.k) and m >= min_rows and (norm is None and acc is None or _fusable(x, w, norm, acc)):
            return _r16(x, w, u, sc, norm, eps, glu, acc, form)
    if norm is not None or glu:
        return cpu(_prologue(x, w, norm, eps, glu), w, acc=acc)
    route = _route(x, w)
    if acc is None:
        return route(x, w)
    if route is _int_dots and x.dtype == acc.dtype == torch.float32 and _fusable(x, w, None, acc):
        return _int_dots(x, w, acc)   # the C adds into acc (float32: the same floats as adding after)
    return _epilogue(route(x, w), acc)


def _route(x: torch.Tensor, w: QWeight) -> Callable[[torch.Tensor, QWeight], torch.Tensor]:
    """Which unfused product computes x [M, K] times w here."""
    if w.qtype in FLOATS:
        return _float_rows
    if _LIB is None or x.dtype not in _XDTYPES or x.stride(-1) != 1 or w.raw.stride(-1) != 1 or x.device.type != "cpu":
        return _torch_tiles
    if w.qtype in _R16:   # the repacked integer GEMM beats dequantized tiles + oneDNN bf16 at every M measured (1-512)
        return _int_dots
    prefill = PREFILL_ROWS[w.qtype] * (1 if _BF16_GEMM else 2)   # float32 tiles: about half the GEMM speed
    return _dequant_tiles if x.shape[0] >= prefill else _int_dots


# Repacked 32-block weights for 2+ rows (see qmatmul_r16 in the C): built on a weight's first
# batched call and kept on that QWeight (so they live and die with the model that owns it), tagged
# with this module version's token: a reloaded qmatmul builds its own.
_TOKEN = object()


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
    if cached is not None and cached[0] is _TOKEN:
        return cached[1:]
    form = _R16_FORM[T(w.qtype)]
    u, sc, rc = _repack(w, form)
    if rc == 2:   # a min beyond float16 (Q4_0's -8 d, Q5_0's -16 d past 65504): the float32 form
        form = 0
        u, sc, rc = _repack(w, form)
    assert rc == 0, "qrepack failed"
    entry = (u, sc, form, 1 if _serves_one_row(w, form) else 2)
    object.__setattr__(w, "_qmatmul_r16", (_TOKEN, *entry))   # a cache on a frozen dataclass
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
    if cached is not None and cached[0] is _TOKEN:
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


def _int_dots(x: torch.Tensor, w: QWeight, acc: torch.Tensor | None = None) -> torch.Tensor:
    """Small M: 8-bit activations . unpacked weight rows, integer dots in C (see the docstring);
    from 2 rows on, 32-block formats run on their repacked form (16 output rows per vector).
    acc: the product is added into it (a float32 [M, N] with unit column stride)."""
    if repacked_serves(w, x.shape[0]) and w.n:
        u, sc, form, _ = repacked(w)
        return _r16(x, w, u, sc, acc=acc, form=form)
    y = torch.empty(x.shape[0], w.n, dtype=x.dtype) if acc is None else acc
    if x.shape[0] and w.n:
        block_bytes = gguf.GGML_QUANT_SIZES[T(w.qtype)][1]
        rc = _LIB.qmatmul(w.raw.data_ptr(), x.data_ptr(), y.data_ptr(), x.shape[0], w.n, w.k, w.raw.stride(0),
                          x.stride(0), y.stride(0), block_bytes, w.qtype, native.is_bf16(x), native.is_bf16(y),
                          acc is not None, torch.get_num_threads())
        assert rc == 0, "qmatmul: out of memory"
    return y


def _r16(x: torch.Tensor, w: QWeight, u: torch.Tensor, sc: torch.Tensor, norm: torch.Tensor | None = None,
         eps: float = 0.0, glu: bool = False, acc: torch.Tensor | None = None, form: int = 0) -> torch.Tensor:
    """x [M, K] (unit last stride) times the repacked weight (`form`: see repacked) -> [M, N] in
    x's dtype (fusions: `cpu`)."""
    y = torch.empty(x.shape[0], w.n, dtype=x.dtype) if acc is None else acc
    gw = 0 if norm is None else norm.data_ptr()
    rc = _LIB.qmatmul_r16(u.data_ptr(), sc.data_ptr(), x.data_ptr(), y.data_ptr(), gw, x.shape[0], w.n, w.k,
                          x.stride(0), y.stride(0), eps, x.dtype == torch.bfloat16, y.dtype == torch.bfloat16,
                          norm is not None and norm.dtype == torch.bfloat16, glu, acc is not None, form,
                          R16_OFFSET.get(w.qtype, 0), torch.get_num_threads())
    assert rc == 0, "qmatmul: out of memory"
    return y


def _fusable(x: torch.Tensor, w: QWeight, norm: torch.Tensor | None, acc: torch.Tensor | None) -> bool:
    """Whether the C reads `norm` and writes `acc` as they are (float CPU tensors of the right shapes)."""
    return (norm is None or (norm.dtype in _XDTYPES and norm.shape == (w.k,) and norm.is_contiguous() and norm.is_cpu)) \
        and (acc is None or (acc.dtype in _XDTYPES and acc.shape == (x.shape[0], w.n) and acc.stride(1) == 1
                             and acc.is_cpu))


def _prologue(x: torch.Tensor, w: QWeight, norm: torch.Tensor | None, eps: float, glu: bool) -> torch.Tensor:
    """The fused input as a float32 tensor [M, K] for the unfused paths: the C prologue (the same
    floats as the fused one), or torch's formulas without the library or with unusual tensors."""
    k = w.k
    if _LIB is None or not x.is_cpu or x.dim() != 2 or x.stride(1) != 1 or x.dtype not in _XDTYPES \
            or x.shape[1] != (2 * k if glu else k) or not _fusable(x, w, norm, None):
        return _prologue_ref(x, norm, eps, glu)
    out = torch.empty(x.shape[0], k, dtype=torch.float32)
    _LIB.qprologue(x.data_ptr(), out.data_ptr(), 0 if norm is None else norm.data_ptr(), x.shape[0], k, x.stride(0),
                   eps, native.is_bf16(x), norm is not None and native.is_bf16(norm), glu, torch.get_num_threads())
    return out if x.dtype == torch.float32 else out.to(x.dtype)


def _dequant_tiles(x: torch.Tensor, w: QWeight) -> torch.Tensor:
    """Large M: tiles of W dequantized in C, then torch's GEMM: in bf16 where the CPU runs bf16
    natively (3-4x float32's speed; bf16 rounding of W and x is below the 8-bit activation error),
    else in float32."""
    y = torch.empty(x.shape[0], w.n, dtype=x.dtype)
    rows, block_bytes = tile_rows(w.k), gguf.GGML_QUANT_SIZES[T(w.qtype)][1]
    tile = torch.empty(min(rows, w.n), w.k, dtype=torch.bfloat16 if _BF16_GEMM else torch.float32)
    x = x.to(tile.dtype)
    for n0 in range(0, w.n, rows):
        n1 = min(w.n, n0 + rows)
        _LIB.qdequant(w.raw.data_ptr(), tile.data_ptr(), n0, n1, w.k, w.raw.stride(0), block_bytes, w.qtype,
                      native.is_bf16(tile), torch.get_num_threads())
        y[:, n0:n1] = torch.matmul(x, tile[: n1 - n0].T)
    return y


def _torch_tiles(x: torch.Tensor, w: QWeight) -> torch.Tensor:
    """No native library: W dequantized once by gguf's dequantizer (tile by tile) and kept on the
    QWeight in float32, then torch's matmul. Why keep it: dequantizing in numpy at every call made
    a SmolLM2 decode step take seconds (the whole suite under SLOTSERVER_NATIVE=0 ~3x its time);
    4 bytes per weight is the price of running without a compiler (--weights dense costs the same)."""
    dense = w.__dict__.get("_qmatmul_dense")
    if dense is None or dense[0] is not _TOKEN or dense[1].device != x.device:
        rows = tile_rows(w.k)
        full = torch.cat([dequantize(w, n0, n0 + rows) for n0 in range(0, w.n, rows)]).to(x.device)
        w.__dict__["_qmatmul_dense"] = dense = (_TOKEN, full)   # [n, k] float32, this module version's
    return F.linear(x.float(), dense[1]).to(x.dtype)


def _float_rows(x: torch.Tensor, w: QWeight) -> torch.Tensor:
    """F32/F16/BF16 rows: a view of the raw bytes, multiplied in float32 tile by tile."""
    wv, rows = w.float_view().to(x.device), tile_rows(w.k)
    y = torch.empty(x.shape[0], w.n, dtype=torch.float32, device=x.device)
    xf = x.float()
    for n0 in range(0, w.n, rows):
        y[:, n0:n0 + rows] = F.linear(xf, wv[n0:n0 + rows].float())
    return y.to(x.dtype)


# Triton: Q8_0 and Q4_0 dequantized in-kernel (QTYPE), any other format dequantized on the host and
# multiplied by the same kernel in float mode (QTYPE 0: w is a float [N, K] tensor).
@_triton.jit
def _qmatmul_kernel(x_ptr, w_ptr, y_ptr, M, N, K, stride_x, stride_w, stride_y,
                    QTYPE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """One program per [BLOCK_M, BLOCK_N] output tile; K in steps of 32 (one quant block)."""
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    j = tl.arange(0, 32)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for kb in range(0, tl.cdiv(K, 32)):
        k = kb * 32 + j
        xt = tl.load(x_ptr + offs_m[:, None].to(tl.int64) * stride_x + k[None, :],
                     mask=(offs_m[:, None] < M) & (k[None, :] < K), other=0.0).to(tl.float32)   # [BM, 32]
        rows = w_ptr + offs_n[:, None].to(tl.int64) * stride_w
        nmask = offs_n[:, None] < N
        if QTYPE == 0:
            wt = tl.load(rows + k[None, :], mask=nmask & (k[None, :] < K), other=0.0).to(tl.float32)
        else:
            blk = rows + kb * (34 if QTYPE == 8 else 18)                                          # [BN, 1]
            lo = tl.load(blk, mask=nmask, other=0).to(tl.uint16)
            hi = tl.load(blk + 1, mask=nmask, other=0).to(tl.uint16)
            d = (lo | (hi << 8)).to(tl.float16, bitcast=True).to(tl.float32)                       # [BN, 1]
            if QTYPE == 8:
                q = tl.load(blk + 2 + j[None, :], mask=nmask, other=0).to(tl.int8, bitcast=True).to(tl.float32)
            else:
                b = tl.load(blk + 2 + (j[None, :] % 16), mask=nmask, other=0).to(tl.int32)
                q = ((b >> (4 * (j[None, :] // 16))) & 15).to(tl.float32) - 8.0
            wt = q * d                                                                           # [BN, 32]
        acc += tl.dot(xt, tl.trans(wt))
    tl.store(y_ptr + offs_m[:, None].to(tl.int64) * stride_y + offs_n[None, :], acc.to(y_ptr.dtype.element_ty),
             mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))


TRITON_BLOCK_M, TRITON_BLOCK_N = 16, 32


def triton(x: torch.Tensor, w: QWeight, norm: torch.Tensor | None = None, eps: float = 0.0, glu: bool = False,
           acc: torch.Tensor | None = None) -> torch.Tensor:
    """Same contract as `cpu` (x and w.raw on the CUDA device, or CPU under TRITON_INTERPRET=1);
    the fusions in torch around the kernel (on a GPU the launches, not the Python, are the cost).
    Not what serves blocks on a GPU (it dequantizes K-quants on the host per call): that is
    kernels/qmatmul_gpu.py (`--gpu-weights blocks`), every format dequantized in the kernel."""
    if norm is not None or glu or acc is not None:
        return _epilogue(triton(_prologue_ref(x, norm, eps, glu).contiguous(), w), acc)
    assert x.dim() == 2 and x.stride(1) == 1 and x.shape[1] == w.k
    y = torch.empty(x.shape[0], w.n, dtype=x.dtype, device=x.device)
    if w.qtype in (T.Q8_0, T.Q4_0):
        wt, qtype = w.raw, int(w.qtype)
    else:   # host dequantization (gguf's), then the kernel's float mode
        wt = (w.float_view() if w.qtype in FLOATS else dequantize(w)).to(x.device).contiguous()
        qtype = 0
    if x.shape[0] and w.n:
        grid = (_triton.cdiv(x.shape[0], TRITON_BLOCK_M), _triton.cdiv(w.n, TRITON_BLOCK_N))
        _qmatmul_kernel[grid](x, wt, y, x.shape[0], w.n, w.k, x.stride(0), wt.stride(0), y.stride(0),
                              QTYPE=qtype, BLOCK_M=TRITON_BLOCK_M, BLOCK_N=TRITON_BLOCK_N)
    return y


EXAMPLE_TYPES = (T.Q4_0, T.Q8_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K, T.MXFP4, T.F16, T.BF16,
                 T.F32)


def example_inputs(gen: torch.Generator, dtype: torch.dtype) -> tuple:
    """x [M, K] unit-variance, M small; W random valid blocks of one of the formats above; half
    of the draws with one of the fusions (x is then gate|up [M, 2K] for glu; an RMSNorm weight
    near 1; a residual acc [M, N] in float32, as the model's)."""
    qtype = EXAMPLE_TYPES[int(torch.randint(len(EXAMPLE_TYPES), (), generator=gen))]
    block = gguf.GGML_QUANT_SIZES[qtype][0]
    k = (256 if block == 256 else 32) * int(torch.randint(1, 4 if block == 256 else 12, (), generator=gen))
    m, n = int(torch.randint(1, 9, (), generator=gen)), int(torch.randint(1, 48, (), generator=gen))
    w = random_qweight(gen, qtype, n, k)
    fuse = int(torch.randint(6, (), generator=gen))   # 0-2: none; 3: norm; 4: glu + acc; 5: norm + acc
    glu, norm = fuse == 4, (1 + 0.1 * torch.randn(k, generator=gen)).to(dtype) if fuse in (3, 5) else None
    acc = torch.randn(m, n, generator=gen) if fuse >= 4 else None
    x = torch.randn(m, 2 * k if glu else k, generator=gen).to(dtype)
    return (x, w) if fuse < 3 else (x, w, norm, 1e-5, glu, acc)


def _aot(qtype: int, x: str, w: str) -> tuple:
    sig = {"x_ptr": f"*{x}", "w_ptr": f"*{w}", "y_ptr": f"*{x}", "M": "i32", "N": "i32", "K": "i32",
           "stride_x": "i32", "stride_w": "i32", "stride_y": "i32", "QTYPE": "constexpr",
           "BLOCK_M": "constexpr", "BLOCK_N": "constexpr"}
    return (_qmatmul_kernel, sig, {"QTYPE": qtype, "BLOCK_M": TRITON_BLOCK_M, "BLOCK_N": TRITON_BLOCK_N})


AOT = [_aot(8, "bf16", "u8"), _aot(2, "bf16", "u8"), _aot(2, "fp32", "u8"), _aot(0, "fp32", "fp32")]
