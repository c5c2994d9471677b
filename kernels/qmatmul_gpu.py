"""qmatmul_gpu: `y[M, N] = x[M, K] @ W^T` with W GGUF blocks kept in their raw bytes on the GPU
(`--device cuda --gpu-weights blocks`), the blocks read inside the Triton kernels.

Why a module of its own and not kernels/qmatmul.py's `triton()`: qmatmul.py is the CPU product (C
integer dots, repacked forms, ~450 lines); its `triton()` dequantizes K-quants on the host per
call, which no GPU step can afford. This op reads every format it serves from the device's copy
of the file's blocks, so the weight bytes a step reads are the file's (Q4_K: 0.56 bytes per
weight against bf16's 2; a 0.5B Q4_K_M 330 MB instead of 988, a Llama-3.1-8B 4.9 GB instead of
16, a 70B Q4_K that fits an 80 GB card at all).

Formats (`FORMATS`; ggml-common.h's layouts, see runtime/qblocks.py): Q4_0, Q4_1, Q5_0, Q5_1,
Q8_0, Q4_K, Q5_K, Q6_K, MXFP4: what Q4_K_M / Q5_K_M / Q6_K / Q8_0 files and gpt-oss use (Q4_K_M
mixes Q4_K and Q6_K, with Q5_0 / Q8_0 fallbacks for rows not a multiple of 256). Q2_K / Q3_K and
the IQ formats have no kernel here: on CUDA they are dequantized to bf16 at load (weights.py).

Three products, each a part of this module (runtime/kernel_parts.py: validated, versioned and
reloaded with it); `triton()` picks one per call by format and row count:
- `_qmatmul_gpu_mma.py`, with QMMA = "int8" (the default since an H200 run; SLOTSERVER_QMMA=off to
  A/B): 3-16 rows of Q4_K, 5-16 of Q6_K, as int8 tensor-core dots of x's q8_1 rows;
- `_qmatmul_gpu_wide.py`, with QGEMV = "wide" (the default; SLOTSERVER_QGEMV=slices to A/B): 1-8
  rows (1-2 of Q4_K, 1-4 of Q6_K where the int8 product serves) of every format but MXFP4,
  llama.cpp's mmvq in Triton (q8_1 x, dp4a on packed words; on an H200 2.8-4x faster a Llama-8B
  model step than the slices);
- `_qmatmul_gpu_slices.py`: everything else; 32 values dequantized to float32 at a time up to 16
  rows, W dequantized tile by tile for cuBLAS from DEQUANT_GEMM_ROWS rows (prefill).
They share the GGUF block readers (`_qmatmul_gpu_blocks.py`) and x's q8_1 (`_q8_1.py`).
A row's floats do not depend on M within one product (each plans by N and K only), not across
products: batch-invariant as far as cuBLAS on a dense copy is, which picks its kernel by M too.
Where cuBLAS on a dense bf16 copy beats these is measured by playground/gpu_qmatmul_bench.py
(whose `--tune` sweeps the parts' tile constants on a card) and decided by `--gpu-weights`
(model/config.py; docs/architecture.md "Weights on the GPU").

Fusions: `acc` (the residual add) is fused into the store where K is not split (`_output`); the
model's norm / SiLU-gate prologue runs as the rms_norm / silu_mul kernels before (QLinear.fused).

TOL: the slices dequantize exactly in float32 and round the weight to x's dtype for tl.dot (bf16:
2^-9 relative, as a dense bf16 copy is), the sums are float32; the wide and int8 products differ
from them by x's 8-bit quantization (as kernels/qmatmul.py on the CPU does), within TOL.
"""

from __future__ import annotations

import os

import gguf
import torch

from slotserver.runtime import kernel_parts
from slotserver.runtime.gpu_info import sm_count
from slotserver.runtime.qblocks import FLOATS, T, QWeight, dequantize, random_qweight

slices = kernel_parts.load(__file__, "_qmatmul_gpu_slices.py")
wide = kernel_parts.load(__file__, "_qmatmul_gpu_wide.py")
mma = kernel_parts.load(__file__, "_qmatmul_gpu_mma.py")

OP = "qmatmul_gpu"
TOL = {torch.float32: 3e-2, torch.bfloat16: 4e-2}
# `x_q8` (optional, every implementation takes it): x's q8_1 where the caller has it already
# (kernels/rms_norm.py's `q8_1` fusion, with the same `_quantize32`): the wide and int8 products read
# it instead of quantizing x in a launch of their own; the others, and the references, multiply x.
# Not checked here: the kernel that wrote it checked its buffers (`_q8_1.check`, ~3 us a call, once
# per x instead of once per matmul part reading it).
FUSES = ("x_q8",)
FORMATS = slices.FORMATS


def _env_switch(name: str, default: str, choices: tuple[str, ...]) -> str:
    """Environment variable `name` (default `default`), refused by name unless one of `choices`."""
    mode = os.environ.get(name, default)
    if mode not in choices:
        raise ValueError(f"{name}={mode!r}: expected {' or '.join(map(repr, choices))}")
    return mode


def _qgemv_mode() -> str:
    """SLOTSERVER_QGEMV: `wide` (the default since an H200 run, docs/gpu.md 2026-11-27: Llama-8B's
    shape in Q4_K at b=1 4.1 ms a step against the slices' 11.4, at b=8 17.2 against 68.6) or `slices`
    (the per-32-value slices kernel, kept for formats and rows the wide one cannot read and as the A/B);
    read once at load, so a bench flips the module constant `QGEMV`."""
    return _env_switch("SLOTSERVER_QGEMV", "wide", ("slices", "wide"))



QGEMV = _qgemv_mode()


def _qmma_mode() -> str:
    """SLOTSERVER_QMMA: `int8` (the default since an H200 run, docs/gpu.md 2026-11-28: Llama-8B's shape
    in Q4_K at b=8 6.9-7.2 ms a step against the wide GEMV's 19.5) or `off` (the A/B); read once at load
    (a bench flips the constant QMMA)."""
    return _env_switch("SLOTSERVER_QMMA", "int8", ("off", "int8"))



QMMA = _qmma_mode()


def reference(x: torch.Tensor, w: QWeight, acc: torch.Tensor | None = None, x_q8: tuple | None = None) -> torch.Tensor:
    """gguf's dequantizer, then a float32 matmul: x [M, K] -> [M, N] in x's dtype (added into acc
    and acc returned when given)."""
    wf = dequantize(w) if w.qtype not in FLOATS else w.float_view().cpu().float()
    y = (x.cpu().float() @ wf.T).to(x.dtype).to(x.device)
    return y if acc is None else acc.add_(y.to(acc.dtype))


def cpu(x: torch.Tensor, w: QWeight, acc: torch.Tensor | None = None, x_q8: tuple | None = None) -> torch.Tensor:
    """On the CPU the blocks are served by kernels/qmatmul.py; this is the same product by gguf's
    dequantizer and torch (what qmatmul does without a compiler), so the contract holds."""
    return reference(x, w, acc)



def _wide_ok(x: torch.Tensor, w: QWeight) -> bool:
    """The wide GEMV serves: switched on (QGEMV) and able to read this product (`wide.reads`)."""
    return QGEMV == "wide" and wide.reads(x, w)


def _mma_ok(x: torch.Tensor, w: QWeight) -> bool:
    """The int8 tensor-core product serves: switched on (QMMA) and able to read it (`mma.reads`)."""
    return QMMA == "int8" and mma.reads(x, w)


def triton(x: torch.Tensor, w: QWeight, acc: torch.Tensor | None = None, x_q8: tuple | None = None) -> torch.Tensor:
    """Same contract as `reference` (x and w.raw on the CUDA device, or CPU under TRITON_INTERPRET=1);
    x_q8: x's q8_1 (FUSES), read by the products that quantize x."""
    assert w.qtype in FORMATS, f"qmatmul_gpu: no kernel for {w.name} (dequantized at load instead)"
    assert x.dim() == 2 and x.shape[1] == w.k and w.raw.stride(1) == 1
    x = x if x.stride(1) == 1 else x.contiguous()
    m, n = x.shape[0], w.n
    part = mma if _mma_ok(x, w) else wide if _wide_ok(x, w) else None
    if part is None and m >= slices.DEQUANT_GEMM_ROWS and n:
        return slices.dequant_gemm(x, w, acc)
    part = part or slices
    sms = sm_count(x.device)
    split = part.splits(m, n, w.k, w.qtype, sms)
    y, fused = _output(x, n, split, acc)
    if m and n:
        part.launch(x, w, y, fused, sms, x_q8)
    return _finish(y, x, split, fused, acc)


def _output(x: torch.Tensor, n: int, split: int, acc: torch.Tensor | None) -> tuple[torch.Tensor, bool]:
    """Where a K-split product writes: float32 partials [split, M, N] (summed by torch: deterministic,
    unlike atomics), else acc itself when the residual add can be fused into the store (`fused`),
    else a new [M, N] in x's dtype."""
    m = x.shape[0]
    fused = acc is not None and split == 1 and acc.shape == (m, n) and acc.stride(1) == 1
    if split > 1:
        return torch.empty(split, m, n, dtype=torch.float32, device=x.device), False
    return (acc if fused else torch.empty(m, n, dtype=x.dtype, device=x.device)), fused


def _finish(y: torch.Tensor, x: torch.Tensor, split: int, fused: bool, acc: torch.Tensor | None) -> torch.Tensor:
    """`_output`'s buffer as the call's result: the partials summed, in x's dtype or added into acc."""
    if fused:
        return acc
    y = y.sum(0) if split > 1 else y                                                   # [M, N]
    return y.to(x.dtype) if acc is None else acc.add_(y.to(acc.dtype))


def example_inputs(gen: torch.Generator, dtype: torch.dtype) -> tuple:
    """x [M, K] unit-variance with M on both sides of SMALL_M and some past DEQUANT_GEMM_ROWS (every
    product); W random valid blocks
    of one of FORMATS; a third of the draws add into a float32 residual `acc`."""
    qtype = FORMATS[int(torch.randint(len(FORMATS), (), generator=gen))]
    block = gguf.GGML_QUANT_SIZES[qtype][0]
    k = block * int(torch.randint(1, 3 if block == 256 else 12, (), generator=gen))
    m = int(torch.randint(1, 9, (), generator=gen)) + [0, slices.SMALL_M, slices.DEQUANT_GEMM_ROWS][int(torch.randint(3, (), generator=gen))]
    n = int(torch.randint(1, 80, (), generator=gen))
    w = random_qweight(gen, qtype, n, k)
    x = torch.randn(m, k, generator=gen).to(dtype)
    return (x, w) if torch.rand((), generator=gen) < 0.67 else (x, w, torch.randn(m, n, generator=gen))


def bench_inputs(device: str, small: bool = False) -> list[tuple[str, tuple]]:
    """`lab check --time`: Llama-8B's wo (4096 x 4096) and gate_up (28672 x 4096) in Q4_K, bf16 x
    at decode sizes and a prefill chunk (the bytes counted are the blocks': what a call must read)."""
    gen = torch.Generator().manual_seed(0)
    sizes = [(1, 40, 256)] if small else [(1, 4096, 4096), (8, 4096, 4096), (1, 28672, 4096), (512, 4096, 4096)]
    out = []
    for m, n, k in sizes:
        w = random_qweight(gen, T.Q4_K, n, k)
        out.append((f"Q4_K {m} x {n} x {k}", (torch.randn(m, k, generator=gen).to(device, torch.bfloat16),
                                               QWeight(w.raw.to(device), w.qtype, k, n))))
    return out


def bench_flops(x: torch.Tensor, w: QWeight, acc: torch.Tensor | None = None) -> int:
    return 2 * x.shape[0] * w.n * w.k



# What `slotserver lab check` compiles for sm_80 / sm_90 (each part lists its own, with ptxas's counts)
AOT = slices.AOT + wide.AOT + mma.AOT + wide._q8_1.AOT
