"""gelu_mul: the GeGLU gate, `gelu_tanh(gate) * up` on a fused `[tokens, 2*d_ff]` gate|up projection.

Gemma's FFN (llama.cpp's LLM_FFN_GELU + LLM_FFN_PAR): the tanh approximation of GELU,
`0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3)))`. Since `0.5 (1 + tanh(z)) = sigmoid(2z)`, it is
`g / (1 + exp(-2z))`: the same shape as silu_mul's `g / (1 + exp(-g))`, so the C kernel reuses its
exp and division-free reciprocal.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
import triton as _triton
import triton.language as tl

from slotserver.runtime import native

OP = "gelu_mul"
TOL = {torch.float32: 1e-5, torch.bfloat16: 2e-2}
BLOCK = 1024
SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


def reference(gate_up: torch.Tensor) -> torch.Tensor:
    """gate_up: [tokens, 2*d_ff] -> [tokens, d_ff]; the tanh formula written out in float64."""
    g, u = gate_up.double().chunk(2, dim=-1)
    gelu = 0.5 * g * (1 + torch.tanh(SQRT_2_OVER_PI * (g + 0.044715 * g ** 3)))
    return (gelu * u).to(gate_up.dtype)


# gelu(g) * u in C (kernels/gelu_mul.c): the formula and its vector form are at the top of that file.
NATIVE_C = native.c_source(__file__, "gelu_mul.c")
_LIB = native.build("gelu_mul", NATIVE_C, origin=native.c_path(__file__, "gelu_mul.c"), strict=True)
native.signature(_LIB, "gelu_mul", 2, 3, (native.ctypes.c_int, native.ctypes.c_int), replay=True)


def cpu(gate_up: torch.Tensor) -> torch.Tensor:
    """The C kernel where it applies (one call, no intermediate), else torch's tanh GELU and multiply."""
    if (_LIB is not None and gate_up.dim() == 2 and gate_up.stride(1) == 1 and gate_up.device.type == "cpu"
            and gate_up.dtype in (torch.float32, torch.bfloat16) and gate_up.shape[1] % 2 == 0):
        t, d_ff = gate_up.shape[0], gate_up.shape[1] // 2
        out = torch.empty((t, d_ff), dtype=gate_up.dtype)                          # [tokens, d_ff]
        _LIB.gelu_mul(gate_up.data_ptr(), out.data_ptr(), t, d_ff, gate_up.stride(0), native.is_bf16(gate_up),
                      torch.get_num_threads())
        return out
    g, u = gate_up.chunk(2, dim=-1)
    if g.dtype == torch.float32:
        return F.gelu(g, approximate="tanh") * u
    return (F.gelu(g.float(), approximate="tanh") * u.float()).to(g.dtype)


@_triton.jit
def _gelu_mul_kernel(gu_ptr, out_ptr, stride_gu, stride_out, d_ff, BLOCK: tl.constexpr):
    """Program (row, column block): `gelu_tanh(g) * u` in float32, g and u `d_ff` apart in the row."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < d_ff
    g = tl.load(gu_ptr + row * stride_gu + cols, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(gu_ptr + row * stride_gu + d_ff + cols, mask=mask, other=0.0).to(tl.float32)
    z = 1.5957691216057308 * (g + 0.044715 * g * g * g)
    y = g / (1.0 + tl.exp(-z)) * u
    tl.store(out_ptr + row * stride_out + cols, y.to(out_ptr.dtype.element_ty), mask=mask)


def triton(gate_up: torch.Tensor) -> torch.Tensor:
    """Same contract as `cpu`."""
    assert gate_up.dim() == 2 and gate_up.stride(1) == 1 and gate_up.shape[1] % 2 == 0, \
        f"gate_up must be [tokens, 2*d_ff] with unit last stride, got {tuple(gate_up.shape)} {gate_up.stride()}"
    tokens, d_ff = gate_up.shape[0], gate_up.shape[1] // 2
    out = torch.empty((tokens, d_ff), dtype=gate_up.dtype, device=gate_up.device)
    if tokens and d_ff:
        block = min(BLOCK, _triton.next_power_of_2(d_ff))
        _gelu_mul_kernel[(tokens, _triton.cdiv(d_ff, block))](gate_up, out, gate_up.stride(0), out.stride(0), d_ff,
                                                             BLOCK=block)
    return out


def example_inputs(gen: torch.Generator, dtype: torch.dtype) -> tuple:
    tokens = int(torch.randint(1, 40, (), generator=gen))
    d_ff = int(torch.randint(1, 300, (), generator=gen))
    return (3 * torch.randn(tokens, 2 * d_ff, generator=gen)).to(dtype),



def bench_inputs(device: str, small: bool = False) -> list[tuple[str, tuple]]:
    """`lab check --time`: bf16 gate|up rows of Qwen2.5-0.5B's and Llama-8B's d_ff, 8192 and 64 tokens."""
    sizes = [(7, 80)] if small else [(8192, 4864), (8192, 14336), (64, 14336)]
    return [(f"{t} x 2*{f}", (torch.randn(t, 2 * f, device=device, dtype=torch.bfloat16),)) for t, f in sizes]


def _aot(dtype: str) -> tuple:
    sig = {"gu_ptr": f"*{dtype}", "out_ptr": f"*{dtype}", "stride_gu": "i32", "stride_out": "i32",
           "d_ff": "i32", "BLOCK": "constexpr"}
    return (_gelu_mul_kernel, sig, {"BLOCK": BLOCK})


AOT = [_aot("fp32"), _aot("bf16")]
