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

from slotserver.runtime import cpu_features, kernel_parts, native
from slotserver.runtime.qblocks import FLOATS, T, QWeight, dequantize, random_qweight, tile_rows

_qn = kernel_parts.load(__file__, "_qmatmul_native.py")   # qmatmul.c's library and forms (shared with moe_matmul)
_tri = kernel_parts.load(__file__, "_qmatmul_triton.py")   # the Triton product
_rp = kernel_parts.load(__file__, "_qmatmul_repack.py")    # the repacked weights
NATIVE_C, _LIB = _qn.NATIVE_C, _qn.LIB   # the native contract's names (tests set _LIB = None)
_R16_FORM, R16_OFFSET, _TOKEN = _qn.R16_FORM, _qn.R16_OFFSET, _rp.TOKEN
repacked, repacked_serves = _rp.repacked, _rp.repacked_serves
_R16 = frozenset(_R16_FORM)
_XDTYPES = (torch.float32, torch.bfloat16)
_BF16_GEMM = cpu_features.current().onednn_bf16 and cpu_features.current().variant != "other"


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


def triton(x: torch.Tensor, w: QWeight, norm: torch.Tensor | None = None, eps: float = 0.0, glu: bool = False,
           acc: torch.Tensor | None = None) -> torch.Tensor:
    """Same contract as `cpu` (x and w.raw on the CUDA device, or CPU under TRITON_INTERPRET=1);
    the fusions in torch around the kernel (on a GPU the launches, not the Python, are the cost).
    Not what serves blocks on a GPU (it dequantizes K-quants on the host per call): that is
    kernels/qmatmul_gpu.py (`--gpu-weights blocks`), every format dequantized in the kernel."""
    if norm is not None or glu or acc is not None:
        return _epilogue(triton(_prologue_ref(x, norm, eps, glu).contiguous(), w), acc)
    return _tri.launch(x, w)


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


AOT = _tri.AOT
