"""rope: rotary position embedding in GGML's "normal" mode (adjacent pairs 2i, 2i+1).

GGUF llama q/k weights are permuted for this mode (not the half-split "neox" form). The model
computes `cos`/`sin` once per step from a precomputed table; the op only rotates.
"""

from __future__ import annotations

import torch
import triton as _triton
import triton.language as tl

from slotserver.runtime import native

OP = "rope"
TOL = {torch.float32: 1e-5, torch.bfloat16: 2e-2}


def reference(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [tokens, heads, head_dim]; cos, sin: [tokens, rot_dim/2]; rotates the first rot_dim dims.

    Written with complex numbers: pair (x[2i], x[2i+1]) is multiplied by exp(i*theta).
    """
    rot = 2 * cos.shape[-1]
    xf = x.float()
    pairs = torch.view_as_complex(xf[..., :rot].reshape(*x.shape[:-1], rot // 2, 2).contiguous())
    turn = torch.polar(torch.ones_like(cos.float()), torch.atan2(sin.float(), cos.float()))
    out = torch.view_as_real(pairs * turn.unsqueeze(1)).flatten(-2)
    return torch.cat([out, xf[..., rot:]], dim=-1).to(x.dtype)


# The rotation in C (kernels/rope.c): what it computes, and how, is at the top of that file.
NATIVE_C = native.c_source(__file__, "rope.c")
_LIB = native.build("rope", NATIVE_C, origin=native.c_path(__file__, "rope.c"), strict=True)
native.signature(_LIB, "rope", 4, 8, (native.ctypes.c_int, native.ctypes.c_int, native.ctypes.c_int), replay=True)
_FLOATS = (torch.float32, torch.bfloat16)


def cpu(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """The C kernel where it applies (one call for q and k of every head), else a complex multiply
    in float32: a handful of ops whatever the head count (the real form took ~10), which matters
    at batch 1, where the step's time goes to dispatching small ops."""
    shape, cs = x.shape, cos.shape   # the checks are ordered and written for a decode step's ~30 calls
    if (_LIB is not None and len(shape) == 3 and len(cs) == 2 and cs == sin.shape and cs[0] == shape[0]
            and 2 * cs[1] <= shape[2] and x.dtype in _FLOATS and cos.dtype in _FLOATS and cos.dtype == sin.dtype
            and x.stride(2) == 1 and cos.stride(1) == 1 and sin.stride(1) == 1 and x.is_cpu and cos.is_cpu and sin.is_cpu):
        out = torch.empty(shape, dtype=x.dtype)                                    # [tokens, heads, head_dim]
        sx = x.stride()
        rc = _LIB.rope(x.data_ptr(), cos.data_ptr(), sin.data_ptr(), out.data_ptr(), *shape, cs[1],
                       sx[0], sx[1], cos.stride(0), sin.stride(0), x.dtype == torch.bfloat16, cos.dtype == torch.bfloat16,
                       torch.get_num_threads())
        if rc == 0:
            return out
    rot = 2 * cos.shape[-1]
    pairs = torch.view_as_complex(x[..., :rot].float().unflatten(-1, (rot // 2, 2)))   # [tokens, heads, rot/2]
    turn = torch.complex(cos.float(), sin.float()).unsqueeze(1)                           # [tokens, 1, rot/2]
    out = torch.view_as_real(pairs * turn).flatten(-2).to(x.dtype)
    return out if rot == x.shape[-1] else torch.cat([out, x[..., rot:]], dim=-1)


@_triton.jit
def _rope_kernel(x_ptr, cos_ptr, sin_ptr, out_ptr, stride_xt, stride_xh, stride_ct, stride_st,
                 stride_ot, stride_oh, n_heads, n_rot_pairs, n_pairs,
                 BLOCK_H: tl.constexpr, BLOCK_P: tl.constexpr):
    """One program per token: pair p of every head turns by that token's angle p.

    Each head's row is loaded and stored whole and contiguous ([BLOCK_H, 2*BLOCK_P]: vector loads),
    then split into its even and odd elements in registers. Why: loading x[2p] and x[2p+1] as two
    stride-2 gathers ran at 7-13% of an H100's copy bandwidth (the first GPU run, docs/gpu.md).
    Pairs past the rotated dims (p >= n_rot_pairs) load cos=1, sin=0: they pass through unchanged.
    """
    t = tl.program_id(0).to(tl.int64)
    h = tl.arange(0, BLOCK_H)[:, None]                       # [BLOCK_H, 1]
    e = tl.arange(0, 2 * BLOCK_P)[None, :]                   # [1, 2*BLOCK_P] element of the row
    mask = (h < n_heads) & (e < 2 * n_pairs)
    p = tl.arange(0, BLOCK_P)[None, :]                       # [1, BLOCK_P] pair
    rot = p < n_rot_pairs
    c = tl.load(cos_ptr + t * stride_ct + p, mask=rot, other=1.0).to(tl.float32)
    s = tl.load(sin_ptr + t * stride_st + p, mask=rot, other=0.0).to(tl.float32)
    x = tl.load(x_ptr + t * stride_xt + h * stride_xh + e, mask=mask, other=0.0).to(tl.float32)
    x0, x1 = tl.split(tl.reshape(x, [BLOCK_H, BLOCK_P, 2]))  # [BLOCK_H, BLOCK_P] each: even, odd
    y = tl.reshape(tl.join(x0 * c - x1 * s, x0 * s + x1 * c), [BLOCK_H, 2 * BLOCK_P])
    tl.store(out_ptr + t * stride_ot + h * stride_oh + e, y.to(out_ptr.dtype.element_ty), mask=mask)


def triton(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Same contract as `cpu`; `x` may be a strided view (q/k split out of the fused qkv)."""
    assert x.dim() == 3 and x.stride(2) == 1, f"x must be [tokens, heads, head_dim], unit last stride: {x.stride()}"
    tokens, heads, dim = x.shape
    assert dim % 2 == 0, "rope needs an even head_dim"
    assert cos.shape == sin.shape and cos.dim() == 2 and cos.shape[0] == tokens
    assert 2 * cos.shape[1] <= dim and cos.stride(1) == 1 and sin.stride(1) == 1
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if tokens:
        block_h, block_p = _triton.next_power_of_2(heads), _triton.next_power_of_2(dim // 2)
        _rope_kernel[(tokens,)](x, cos, sin, out, x.stride(0), x.stride(1), cos.stride(0), sin.stride(0),
                                out.stride(0), out.stride(1), heads, cos.shape[1], dim // 2,
                                BLOCK_H=block_h, BLOCK_P=block_p, num_warps=8 if block_h * block_p >= 2048 else 4)
    return out


def example_inputs(gen: torch.Generator, dtype: torch.dtype) -> tuple:
    tokens = int(torch.randint(1, 30, (), generator=gen))
    heads = int(torch.randint(1, 6, (), generator=gen))
    half = int(torch.randint(1, 40, (), generator=gen))
    extra = 2 * int(torch.randint(0, 3, (), generator=gen))
    x = torch.randn(tokens, heads, 2 * half + extra, generator=gen).to(dtype)
    theta = torch.rand(tokens, half, generator=gen) * 100
    return x, theta.cos().to(dtype), theta.sin().to(dtype)



def bench_inputs(device: str, small: bool = False) -> list[tuple[str, tuple]]:
    """`lab check --time`: the q|k heads of bf16 qkv rows (a strided view, as the model passes them),
    float32 cos/sin [tokens, head_dim / 2]: Qwen2.5-0.5B (14 + 2 heads x 64), Llama-8B (32 + 8 x 128)."""
    sizes = [(7, 3, 1, 16)] if small else [(8192, 14, 2, 64), (8192, 32, 8, 128), (64, 32, 8, 128)]
    out = []
    for t, h, kv, d in sizes:
        qkv = torch.randn(t, h + 2 * kv, d, device=device, dtype=torch.bfloat16)
        theta = torch.rand(t, d // 2, device=device) * 100
        out.append((f"{t} x ({h}+{kv}) x {d}", (qkv[:, : h + kv], theta.cos(), theta.sin())))
    return out


def _aot(x: str, blocks: tuple[int, int]) -> tuple:
    sig = {"x_ptr": f"*{x}", "cos_ptr": "*fp32", "sin_ptr": "*fp32", "out_ptr": f"*{x}",
           **{name: "i32" for name in ("stride_xt", "stride_xh", "stride_ct", "stride_st",
                                       "stride_ot", "stride_oh", "n_heads", "n_rot_pairs", "n_pairs")},
           "BLOCK_H": "constexpr", "BLOCK_P": "constexpr"}
    return (_rope_kernel, sig, {"BLOCK_H": blocks[0], "BLOCK_P": blocks[1]})


AOT = [_aot("fp32", (16, 32)), _aot("bf16", (32, 64))]  # SmolLM2-135M q (9 heads x 64), 8B-class q
