"""rms_norm: `y = x / sqrt(mean(x^2) + eps) * weight`, llama.cpp's RMS_NORM followed by MUL.

Contract (every kernel module): `OP`, `reference(...)` in plain torch (the ground truth), `cpu(...)`
(the implementation the CPU engine calls), `triton(...)` (same signature, what a CUDA engine
calls), `example_inputs(gen, dtype)` for validation, `TOL`, and `AOT` (compile specs for the
ahead-of-time check: `(jit_fn, signature, constexprs)`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton as _triton
import triton.language as tl

from slotserver.lab import native

OP = "rms_norm"
TOL = {torch.float32: 1e-5, torch.bfloat16: 2e-2}


def reference(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x: [tokens, dim], weight: [dim] -> [tokens, dim], computed in float32."""
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + eps)
    return (y * weight.float()).to(x.dtype)


# One pass per row in C (`slotserver.lab.native`): the sum of squares and the scaled store, float32 math.
NATIVE_C = r"""
int rms_norm(const void *x, const void *w, void *out, int64_t T, int64_t N, int64_t sx,
             float eps, int xb, int wb, int n_threads) {
    #pragma omp parallel for num_threads(n_threads) if (T * N >= 65536) schedule(static)
    for (int64_t t = 0; t < T; t++) {
        float ss = 0.0f;
        for (int64_t i = 0; i < N; i++) { const float v = ld(x, t * sx + i, xb); ss += v * v; }
        const float r = 1.0f / sqrtf(ss / (float)N + eps);
        for (int64_t i = 0; i < N; i++) st(out, t * N + i, xb, ld(x, t * sx + i, xb) * r * ld(w, i, wb));
    }
    return 0;
}
"""
_LIB = native.build("rms_norm", NATIVE_C, origin=__file__, strict=True)
native.signature(_LIB, "rms_norm", 3, 3, (native.ctypes.c_float, native.ctypes.c_int, native.ctypes.c_int, native.ctypes.c_int),
                 replay=True)
_FLOATS = (torch.float32, torch.bfloat16)


def cpu(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """The C kernel where it applies (one call instead of ~7 small torch ops), else torch."""
    if (_LIB is not None and x.dim() == 2 and x.is_cpu and weight.is_cpu and x.dtype in _FLOATS and weight.dtype in _FLOATS
            and x.stride(1) == 1 and weight.is_contiguous() and weight.shape == x.shape[1:]):
        out = torch.empty(x.shape, dtype=x.dtype)                                  # [tokens, dim]
        _LIB.rms_norm(x.data_ptr(), weight.data_ptr(), out.data_ptr(), x.shape[0], x.shape[1], x.stride(0),
                      eps, native.is_bf16(x), native.is_bf16(weight), torch.get_num_threads())
        return out
    if x.dtype == torch.float32:  # 4 cheap ops: F.rms_norm's CPU path measured 1.2-1.4x slower in the model
        r = torch.linalg.vector_norm(x, dim=-1, keepdim=True).square_().div_(x.shape[-1]).add_(eps).rsqrt_()
        return torch.mul(x, weight).mul_(r)
    return F.rms_norm(x.float(), (x.shape[-1],), weight.float(), eps).to(x.dtype)


@_triton.jit
def _rms_norm_kernel(x_ptr, w_ptr, out_ptr, stride_x, stride_out, n_cols, eps,
                     BLOCK: tl.constexpr):
    """One program per row: the whole row is loaded once, reduced in float32, scaled, stored."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)   # [BLOCK]
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    inv = tl.rsqrt(tl.sum(x * x, axis=0) / n_cols + eps)
    tl.store(out_ptr + row * stride_out + cols, (x * inv * w).to(out_ptr.dtype.element_ty), mask=mask)


def triton(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Same contract as `cpu`. Rows may be strided; the last dim must be contiguous."""
    assert x.dim() == 2 and x.stride(1) == 1, f"x must be [tokens, dim] with unit last stride, got {x.stride()}"
    assert weight.shape == (x.shape[1],) and weight.stride(0) == 1, "weight must be a contiguous [dim]"
    assert x.dtype in (torch.float32, torch.bfloat16, torch.float16) and x.device == weight.device
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if x.shape[0]:
        block = _triton.next_power_of_2(x.shape[1])
        _rms_norm_kernel[(x.shape[0],)](x, weight, out, x.stride(0), out.stride(0), x.shape[1], eps,
                                        BLOCK=block, num_warps=4 if block <= 2048 else 8)
    return out


def example_inputs(gen: torch.Generator, dtype: torch.dtype) -> tuple:
    tokens = int(torch.randint(1, 40, (), generator=gen))
    dim = int(torch.randint(1, 300, (), generator=gen))
    x = torch.randn(tokens, dim, generator=gen).to(dtype)
    w = (1 + 0.1 * torch.randn(dim, generator=gen)).to(dtype)
    return x, w, 1e-5


def _aot(x: str, w: str, block: int) -> tuple:
    sig = {"x_ptr": f"*{x}", "w_ptr": f"*{w}", "out_ptr": f"*{x}", "stride_x": "i32",
           "stride_out": "i32", "n_cols": "i32", "eps": "fp32", "BLOCK": "constexpr"}
    return (_rms_norm_kernel, sig, {"BLOCK": block})


AOT = [_aot("fp32", "fp32", 1024), _aot("bf16", "fp32", 4096)]
