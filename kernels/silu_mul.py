"""silu_mul: the SwiGLU gate, `silu(gate) * up` on a fused `[tokens, 2*d_ff]` gate|up projection.

The model fuses `ffn_gate` and `ffn_up` into one matmul; this op reads its two halves.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton as _triton
import triton.language as tl

from slotserver.runtime import kernel_parts, native

_q8 = kernel_parts.load(__file__, "_q8_1.py")   # q8_1: the quantizer the integer matmuls read (qmatmul_gpu)
_quantize_into = _q8._quantize_into

OP = "silu_mul"
TOL = {torch.float32: 1e-5, torch.bfloat16: 2e-2}
BLOCK = 1024
# `q8_1` (FUSES, optional in every implementation): buffers (int8 q [tokens, d_ff], float32 d and s
# [tokens, d_ff / 32]: `_q8_1.buffers`) filled with the q8_1 of the output rows as stored (d_ff a
# multiple of 32). Why: qmatmul_gpu's wide and int8 products quantize the down projection's x in a
# launch of their own; given these (its `x_q8`) they read them: one launch fewer a layer
# (model/lean_step.py), the same values (one `_quantize32`, as kernels/rms_norm.py's `q8_1`).
FUSES = ("q8_1",)


def reference(gate_up: torch.Tensor, q8_1: tuple[torch.Tensor, ...] | None = None) -> torch.Tensor:
    """gate_up: [tokens, 2*d_ff] -> [tokens, d_ff]; q8_1: the result's q8_1 written there (FUSES)."""
    g, u = gate_up.float().chunk(2, dim=-1)
    y = (g / (1 + torch.exp(-g)) * u).to(gate_up.dtype)
    if q8_1 is not None:
        _q8.torch_q8_1(y, q8_1)
    return y


# silu(g) * u in C (kernels/silu_mul.c), with the native prelude's silu_mul1 / 8 / 16.
NATIVE_C = native.c_source(__file__, "silu_mul.c")
_LIB = native.build("silu_mul", NATIVE_C, origin=native.c_path(__file__, "silu_mul.c"), strict=True)
native.signature(_LIB, "silu_mul", 2, 3, (native.ctypes.c_int, native.ctypes.c_int), replay=True)


def cpu(gate_up: torch.Tensor, q8_1: tuple[torch.Tensor, ...] | None = None) -> torch.Tensor:
    """The C kernel where it applies (one call, no intermediate), else torch's silu and multiply;
    `q8_1` by torch after it (the CPU model does not ask for it)."""
    if q8_1 is not None:
        y = cpu(gate_up)
        _q8.torch_q8_1(y, q8_1)
        return y
    if (_LIB is not None and gate_up.dim() == 2 and gate_up.stride(1) == 1 and gate_up.is_cpu
            and gate_up.dtype in (torch.float32, torch.bfloat16) and gate_up.shape[1] % 2 == 0):
        t, d_ff = gate_up.shape[0], gate_up.shape[1] // 2
        out = torch.empty((t, d_ff), dtype=gate_up.dtype)                          # [tokens, d_ff]
        _LIB.silu_mul(gate_up.data_ptr(), out.data_ptr(), t, d_ff, gate_up.stride(0), native.is_bf16(gate_up),
                      torch.get_num_threads())
        return out
    g, u = gate_up.chunk(2, dim=-1)
    return F.silu(g) * u


@_triton.jit
def _silu_mul_kernel(gu_ptr, out_ptr, q_ptr, d_ptr, s_ptr, stride_gu, stride_out, d_ff, BLOCK: tl.constexpr,
                     Q8: tl.constexpr):
    """Program (row, column block): `silu(g) * u` in float32, g and u `d_ff` apart in the row. Q8:
    the stored block's q8_1 (d_ff a multiple of 32) goes to q/d/s_ptr, rows d_ff and d_ff / 32 apart."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < d_ff
    g = tl.load(gu_ptr + row * stride_gu + cols, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(gu_ptr + row * stride_gu + d_ff + cols, mask=mask, other=0.0).to(tl.float32)
    y = (g / (1.0 + tl.exp(-g)) * u).to(out_ptr.dtype.element_ty)
    tl.store(out_ptr + row * stride_out + cols, y, mask=mask)
    if Q8:   # masked columns are 0: no block's max sees them
        b = tl.program_id(1) * (BLOCK // 32) + tl.arange(0, BLOCK // 32)
        _quantize_into(tl.reshape(y.to(tl.float32), [BLOCK // 32, 32]), q_ptr + row * d_ff
                       + tl.reshape(cols, [BLOCK // 32, 32]), d_ptr + row * (d_ff // 32) + b,
                       s_ptr + row * (d_ff // 32) + b, b < d_ff // 32)


def triton(gate_up: torch.Tensor, q8_1: tuple[torch.Tensor, ...] | None = None) -> torch.Tensor:
    """Same contract as `cpu` (`q8_1` in the same launch)."""
    assert gate_up.dim() == 2 and gate_up.stride(1) == 1 and gate_up.shape[1] % 2 == 0, \
        f"gate_up must be [tokens, 2*d_ff] with unit last stride, got {tuple(gate_up.shape)} {gate_up.stride()}"
    tokens, d_ff = gate_up.shape[0], gate_up.shape[1] // 2
    if q8_1 is not None:
        _q8.check(q8_1, tokens, d_ff, gate_up.device)
    out = torch.empty((tokens, d_ff), dtype=gate_up.dtype, device=gate_up.device)
    if tokens and d_ff:
        block = min(BLOCK, max(32, _triton.next_power_of_2(d_ff)))
        grid = (tokens, _triton.cdiv(d_ff, block))
        q, d, s = q8_1 if q8_1 is not None else (out, out, out)   # unread pointers without Q8
        _silu_mul_kernel[grid](gate_up, out, q, d, s, gate_up.stride(0), out.stride(0), d_ff, BLOCK=block,
                               Q8=q8_1 is not None)
    return out


def example_inputs(gen: torch.Generator, dtype: torch.dtype) -> tuple:
    tokens = int(torch.randint(1, 40, (), generator=gen))
    d_ff = int(torch.randint(1, 300, (), generator=gen))
    return (3 * torch.randn(tokens, 2 * d_ff, generator=gen)).to(dtype),



def bench_inputs(device: str, small: bool = False) -> list[tuple[str, tuple]]:
    """`lab check --time`: bf16 gate|up rows of Qwen2.5-0.5B's and Llama-8B's d_ff, 8192 and 64 tokens."""
    sizes = [(7, 80)] if small else [(8192, 4864), (8192, 14336), (64, 14336)]
    return [(f"{t} x 2*{f}", (torch.randn(t, 2 * f, device=device, dtype=torch.bfloat16),)) for t, f in sizes]


def _aot(dtype: str, q8: bool = False) -> tuple:
    sig = {"gu_ptr": f"*{dtype}", "out_ptr": f"*{dtype}", "q_ptr": "*i8" if q8 else f"*{dtype}",
           "d_ptr": "*fp32" if q8 else f"*{dtype}", "s_ptr": "*fp32" if q8 else f"*{dtype}", "stride_gu": "i32",
           "stride_out": "i32", "d_ff": "i32", "BLOCK": "constexpr", "Q8": "constexpr"}
    return (_silu_mul_kernel, sig, {"BLOCK": BLOCK, "Q8": q8})


AOT = [_aot("fp32"), _aot("bf16"), _aot("bf16", q8=True)]
