"""short_conv_step: one token on each of B sequences through LFM2's short convolution (llama.cpp's
lfm2 `build_shortconv_block`), between the layer's in- and out-projections.

`(out, conv) = short_conv_step(proj, conv, streams, taps)`:
- proj [B, 3 d] float32 or bf16: each row's in-projection, b | c | x;
- conv [S, L - 1, d] float32: every stream's last L - 1 convolution inputs; row b continues stream
  streams[b] ([B] int64, distinct), updated in place;
- taps [d, L] float32 (`shortconv.l_cache` = L wide, no bias);
- out [B, d] in proj's dtype: c * conv(b * x), the causal depthwise convolution over the stream's
  stored inputs and this one. Returned with the state, so that validation compares the update too.

Why a kernel: the same as kernels/delta_net_step.py's: LFM2's decode step ran ~8 small torch ops
a convolution layer (1.7 ms of a 20.8 ms b=1 step of LFM2-350M on 2 cores), which kept every
step out of the step graphs (slotserver/model/step_graph.py). Prompts stay in model/short_conv.py.

TOL: the same float32 products and sums in the same order; bf16: the output's rounding.
"""

from __future__ import annotations

import torch
import triton as _triton
import triton.language as tl

from slotserver.runtime import native

OP = "short_conv_step"
TOL = {torch.float32: 1e-5, torch.bfloat16: 1e-2}


def reference(proj: torch.Tensor, conv: torch.Tensor, streams: torch.Tensor,
              taps: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    b, c, x = proj.float().chunk(3, dim=1)                                 # [B, d] each
    idx = streams.long()
    window = torch.cat([conv[idx], (b * x)[:, None]], dim=1)              # [B, L, d]
    conv[idx] = window[:, 1:]
    return (c * (window * taps.T).sum(1)).to(proj.dtype), conv


NATIVE_C = native.c_source(__file__, "short_conv_step.c")
_LIB = native.build("short_conv_step", NATIVE_C, origin=native.c_path(__file__, "short_conv_step.c"), strict=True)
native.signature(_LIB, "short_conv_step", 5, 5, (native.ctypes.c_int,) * 3, replay=True)


def cpu(proj: torch.Tensor, conv: torch.Tensor, streams: torch.Tensor,
        taps: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One C call (short_conv_step.c); else `reference`."""
    if (_LIB is None or proj.dtype not in (torch.float32, torch.bfloat16) or proj.dim() != 2 or proj.stride(1) != 1
            or streams.dtype != torch.int64 or not streams.is_contiguous()
            or not all(t.is_cpu and t.dtype == torch.float32 and t.is_contiguous() for t in (conv, taps))
            or not (proj.is_cpu and streams.is_cpu)):
        return reference(proj, conv, streams, taps)
    B, d = proj.shape[0], proj.shape[1] // 3
    out = torch.empty(B, d, dtype=proj.dtype)                              # [B, d]
    _LIB.short_conv_step(proj.data_ptr(), conv.data_ptr(), streams.data_ptr(), taps.data_ptr(), out.data_ptr(), B,
                         proj.stride(0), out.stride(0), d, taps.shape[1], native.is_bf16(proj), native.is_bf16(out),
                         torch.get_num_threads())
    return out, conv


@_triton.jit
def _short_conv_kernel(proj_ptr, conv_ptr, taps_ptr, streams_ptr, out_ptr, D, stride_p, stride_o,
                       W: tl.constexpr, BLOCK: tl.constexpr):
    """Program (row b, channel block): u = b x, the convolution with the stream's W stored inputs,
    times c; the stored inputs shift by one (each channel is this program's alone)."""
    row = tl.program_id(0).to(tl.int64)
    cs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    m = cs < D
    p = proj_ptr + row * stride_p + cs
    u = tl.load(p, mask=m, other=0.0).to(tl.float32) * tl.load(p + 2 * D, mask=m, other=0.0).to(tl.float32)
    base = conv_ptr + tl.load(streams_ptr + row) * W * D + cs
    y = tl.zeros([BLOCK], dtype=tl.float32)
    for j in tl.static_range(W):
        y += tl.load(base + j * D, mask=m, other=0.0) * tl.load(taps_ptr + cs * (W + 1) + j, mask=m, other=0.0)
    y += u * tl.load(taps_ptr + cs * (W + 1) + W, mask=m, other=0.0)
    for j in tl.static_range(W - 1):   # oldest first: read j + 1 before it is overwritten
        tl.store(base + j * D, tl.load(base + (j + 1) * D, mask=m, other=0.0), mask=m)
    tl.store(base + (W - 1) * D, u, mask=m)
    c = tl.load(p + D, mask=m, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * stride_o + cs, (c * y).to(out_ptr.dtype.element_ty), mask=m)


BLOCK = 512


def triton(proj: torch.Tensor, conv: torch.Tensor, streams: torch.Tensor,
           taps: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Same contract as `cpu`: one program per row and block of BLOCK channels."""
    assert proj.stride(1) == 1 and conv.is_contiguous(), "proj rows with unit stride, a contiguous state"
    B, d = proj.shape[0], proj.shape[1] // 3
    out = torch.empty(B, d, dtype=proj.dtype, device=proj.device)
    if B:
        _short_conv_kernel[(B, _triton.cdiv(d, BLOCK))](proj, conv, taps.contiguous(), streams.to(torch.int64), out, d,
                                                         proj.stride(0), out.stride(0), W=taps.shape[1] - 1,
                                                         BLOCK=BLOCK)
    return out, conv


def example_inputs(gen: torch.Generator, dtype: torch.dtype) -> tuple:
    """A few sequences on scattered streams, widths across a block's edge, convolutions 2-4 wide."""
    S, d, L = int(torch.randint(2, 7, (), generator=gen)), int(torch.randint(1, 700, (), generator=gen)), \
        int(torch.randint(2, 5, (), generator=gen))
    B = int(torch.randint(1, S + 1, (), generator=gen))
    return (torch.randn(B, 3 * d, generator=gen).to(dtype), torch.randn(S, L - 1, d, generator=gen),
            torch.randperm(S, generator=gen)[:B], 0.5 * torch.randn(d, L, generator=gen))


def bench_inputs(device: str, small: bool = False) -> list[tuple[str, tuple]]:
    """`lab check --time`: LFM2-350M's convolution (1024 channels, width 3) at b=1 and b=32."""
    d, L = (40, 3) if small else (1024, 3)
    return [(f"b={B} d={d}", (torch.randn(B, 3 * d, device=device, dtype=torch.bfloat16),
                              torch.randn(B, L - 1, d, device=device), torch.arange(B, device=device),
                              torch.randn(d, L, device=device)))
            for B in ((2,) if small else (1, 32))]


_SIG = {"proj_ptr": "*bf16", "conv_ptr": "*fp32", "taps_ptr": "*fp32", "streams_ptr": "*i64", "out_ptr": "*bf16",
        "D": "i32", "stride_p": "i32", "stride_o": "i32", "W": "constexpr", "BLOCK": "constexpr"}
AOT = [(_short_conv_kernel, _SIG, {"W": 2, "BLOCK": BLOCK})]
