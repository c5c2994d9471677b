"""short_conv_step: a forward step's rows through LFM2's short convolution (llama.cpp's lfm2
`build_shortconv_block`), between the layer's in- and out-projections: each sequence's new tokens
in order, decode rows and prompt rows alike.

`(out, conv) = short_conv_step(proj, conv, streams, offsets, lens, taps)`:
- proj [T, 3 d] float32 or bf16: each row's in-projection, b | c | x;
- sequence n owns rows offsets[n] .. offsets[n] + lens[n] - 1 and continues stream streams[n] (all
  three [B] int64; streams distinct);
- conv [S, L - 1, d] float32: every stream's last L - 1 convolution inputs, updated in place;
- taps [d, L] float32 (`shortconv.l_cache` = L wide, no bias);
- out [T, d] in proj's dtype: c * conv(b * x), the causal depthwise convolution over the stream's
  stored inputs and this row's. Returned with the state, so that validation compares the update too.

Why a kernel: the same as kernels/delta_net_step.py's: LFM2's decode step ran ~8 small torch ops
a convolution layer (1.7 ms of a 20.8 ms b=1 step of LFM2-350M on 2 cores), which kept every
step out of the step graphs (slotserver/model/step_graph.py).

TOL: the same float32 products and sums (the reference's in torch's order: rounding apart); bf16:
the output's rounding.
"""

from __future__ import annotations

import torch
import triton as _triton
import triton.language as tl

from slotserver.runtime import kernel_parts, native

OP = "short_conv_step"
TOL = {torch.float32: 1e-5, torch.bfloat16: 1e-2}


def reference(proj: torch.Tensor, conv: torch.Tensor, streams: torch.Tensor, offsets: torch.Tensor, lens: torch.Tensor,
              taps: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each sequence's rows at once: its stored inputs, then its rows' u, convolved."""
    b, c, x = proj.float().chunk(3, dim=1)                                 # [T, d] each
    out, L = torch.empty_like(b), taps.shape[1]
    for s, first, n in zip(streams.tolist(), offsets.tolist(), lens.tolist()):
        rows = slice(first, first + n)
        window = torch.cat([conv[s], b[rows] * x[rows]])                   # [L - 1 + n, d]
        conv[s] = window[n:]
        out[rows] = c[rows] * (window.unfold(0, L, 1) * taps).sum(-1)     # [n, d]
    return out.to(proj.dtype), conv


_cc = kernel_parts.load(__file__, "_causal_conv.py")   # its conv_step: a token against the stored window
_conv_step = _cc.conv_step

NATIVE_C = native.c_source(__file__, "short_conv_step.c")
_LIB = native.build("short_conv_step", NATIVE_C, origin=native.c_path(__file__, "short_conv_step.c"), strict=True)
native.signature(_LIB, "short_conv_step", 7, 6, (native.ctypes.c_int,) * 3, replay=True)


def cpu(proj: torch.Tensor, conv: torch.Tensor, streams: torch.Tensor, offsets: torch.Tensor, lens: torch.Tensor,
        taps: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One C call (short_conv_step.c); else `reference`."""
    if (_LIB is None or proj.dtype not in (torch.float32, torch.bfloat16) or proj.dim() != 2 or proj.stride(1) != 1
            or not all(t.dtype == torch.int64 and t.is_contiguous() and t.is_cpu for t in (streams, offsets, lens))
            or not all(t.is_cpu and t.dtype == torch.float32 and t.is_contiguous() for t in (conv, taps))
            or not proj.is_cpu):
        return reference(proj, conv, streams, offsets, lens, taps)
    T, d = proj.shape[0], proj.shape[1] // 3
    out = torch.empty(T, d, dtype=proj.dtype)                              # [T, d]
    rc = _LIB.short_conv_step(proj.data_ptr(), conv.data_ptr(), streams.data_ptr(), offsets.data_ptr(),
                              lens.data_ptr(), taps.data_ptr(), out.data_ptr(), streams.shape[0], T, proj.stride(0),
                              out.stride(0), d, taps.shape[1], native.is_bf16(proj), native.is_bf16(out),
                              torch.get_num_threads())
    assert rc == 0, f"short_conv_step: failed ({rc})"
    return out, conv


@_triton.jit
def _short_conv_kernel(proj_ptr, conv_ptr, taps_ptr, streams_ptr, offsets_ptr, lens_ptr, out_ptr, D, stride_p,
                       stride_o, W: tl.constexpr, BLOCK: tl.constexpr):
    """Program (sequence n, channel block), its rows in order: u = b x, the convolution with the
    stream's W stored inputs, times c; the stored inputs shift by one (each channel is this program's)."""
    n = tl.program_id(0).to(tl.int64)
    cs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    m = cs < D
    base = conv_ptr + tl.load(streams_ptr + n) * W * D + cs
    first = tl.load(offsets_ptr + n)
    for t in range(first, first + tl.load(lens_ptr + n)):
        p = proj_ptr + t * stride_p + cs
        u = tl.load(p, mask=m, other=0.0).to(tl.float32) * tl.load(p + 2 * D, mask=m, other=0.0).to(tl.float32)
        y = _conv_step(base, u, tl.zeros([BLOCK], dtype=tl.float32), taps_ptr, cs, m, D, W)
        c = tl.load(p + D, mask=m, other=0.0).to(tl.float32)
        tl.store(out_ptr + t * stride_o + cs, (c * y).to(out_ptr.dtype.element_ty), mask=m)


BLOCK = 512


def triton(proj: torch.Tensor, conv: torch.Tensor, streams: torch.Tensor, offsets: torch.Tensor, lens: torch.Tensor,
           taps: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Same contract as `cpu`: one program per sequence and block of BLOCK channels."""
    assert proj.stride(1) == 1 and conv.is_contiguous(), "proj rows with unit stride, a contiguous state"
    T, B, d = proj.shape[0], streams.shape[0], proj.shape[1] // 3
    out = torch.empty(T, d, dtype=proj.dtype, device=proj.device)
    if T and B:
        seqs = [x.to(torch.int64).contiguous() for x in (streams, offsets, lens)]
        _short_conv_kernel[(B, _triton.cdiv(d, BLOCK))](proj, conv, taps.contiguous(), *seqs, out, d, proj.stride(0),
                                                         out.stride(0), W=taps.shape[1] - 1, BLOCK=BLOCK)
    return out, conv


def example_inputs(gen: torch.Generator, dtype: torch.dtype) -> tuple:
    """A few sequences of 1-5 tokens on scattered streams, widths across a block's edge,
    convolutions 2-4 wide."""
    S, d, L = int(torch.randint(2, 7, (), generator=gen)), int(torch.randint(1, 700, (), generator=gen)), \
        int(torch.randint(2, 5, (), generator=gen))
    B = int(torch.randint(1, S + 1, (), generator=gen))
    lens = torch.where(torch.rand(B, generator=gen) < 0.6, torch.randint(1, 6, (B,), generator=gen), 1)   # [B]
    return (torch.randn(int(lens.sum()), 3 * d, generator=gen).to(dtype), torch.randn(S, L - 1, d, generator=gen),
            torch.randperm(S, generator=gen)[:B], lens.cumsum(0) - lens, lens, 0.5 * torch.randn(d, L, generator=gen))


def bench_inputs(device: str, small: bool = False) -> list[tuple[str, tuple]]:
    """`lab check --time`: LFM2-350M's convolution (1024 channels, width 3) at b=1 and b=32."""
    d, L = (40, 3) if small else (1024, 3)
    out = []
    for B in ((2,) if small else (1, 32)):
        lens = torch.ones(B, dtype=torch.int64, device=device)
        out.append((f"b={B} d={d}", (torch.randn(B, 3 * d, device=device, dtype=torch.bfloat16),
                                     torch.randn(B, L - 1, d, device=device), torch.arange(B, device=device),
                                     lens.cumsum(0) - lens, lens, torch.randn(d, L, device=device))))
    return out


_SIG = {"proj_ptr": "*bf16", "conv_ptr": "*fp32", "taps_ptr": "*fp32", **_cc.SEQS, "out_ptr": "*bf16", "D": "i32", "stride_p": "i32", "stride_o": "i32", "W": "constexpr",
        "BLOCK": "constexpr"}
AOT = [(_short_conv_kernel, _SIG, {"W": 2, "BLOCK": BLOCK})]
