"""The causal depthwise convolution of a hybrid model's recurrent layers, then SiLU, on CUDA: a part
of kernels/delta_net_step.py and mamba2_step.py (runtime/kernel_parts.py), as causal_conv.c is of
their C kernels.

Program (sequence b, block of BLOCK channels), its rows in order: row t's inputs are
proj[t, OFF + c]; y = bias[c] (BIAS) + the convolution of the stream's W stored inputs (oldest first,
at conv[stream, j, c]) and this one; the stored inputs shift by one; xc[t, c] = silu(y) in float32.
Each channel is this program's alone. `conv_step` (one token of a channel block against the stored
window) is also LFM2's short convolution's (kernels/short_conv_step.py), whose input and output
are gated instead.
"""

from __future__ import annotations

import triton
import triton.language as tl

BLOCK = 512
SEQS = {"streams_ptr": "*i64", "offsets_ptr": "*i64", "lens_ptr": "*i64"}   # the sequences' AOT signature


@triton.jit
def conv_step(base, x, y, taps_ptr, cs, m, C, W: tl.constexpr):
    """One token of a channel block: y plus the W stored inputs (oldest first, at base + j * C) and x
    against the taps [C, W + 1]; the stored inputs shift by one, x stored last -> y."""
    for j in tl.static_range(W):
        y += tl.load(base + j * C, mask=m, other=0.0) * tl.load(taps_ptr + cs * (W + 1) + j, mask=m, other=0.0)
    y += x * tl.load(taps_ptr + cs * (W + 1) + W, mask=m, other=0.0)
    for j in tl.static_range(W - 1):   # oldest first: read j + 1 before it is overwritten
        tl.store(base + j * C, tl.load(base + (j + 1) * C, mask=m, other=0.0), mask=m)
    if W > 0:
        tl.store(base + (W - 1) * C, x, mask=m)
    return y


@triton.jit
def conv_silu_kernel(proj_ptr, conv_ptr, taps_ptr, bias_ptr, streams_ptr, offsets_ptr, lens_ptr, xc_ptr, C, OFF,
                     stride_p, W: tl.constexpr, BLOCK: tl.constexpr, BIAS: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    cs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    m = cs < C
    base = conv_ptr + tl.load(streams_ptr + b) * W * C + cs
    bias = tl.zeros([BLOCK], dtype=tl.float32)
    if BIAS:
        bias = tl.load(bias_ptr + cs, mask=m, other=0.0)
    first = tl.load(offsets_ptr + b)
    for t in range(first, first + tl.load(lens_ptr + b)):
        x = tl.load(proj_ptr + t * stride_p + OFF + cs, mask=m, other=0.0).to(tl.float32)
        y = conv_step(base, x, bias, taps_ptr, cs, m, C, W)
        tl.store(xc_ptr + t * C + cs, y * tl.sigmoid(y), mask=m)


def signature(proj: str) -> dict:
    """The kernel's AOT signature with proj's element type."""
    return {"proj_ptr": f"*{proj}", "conv_ptr": "*fp32", "taps_ptr": "*fp32", "bias_ptr": "*fp32", **SEQS,
            "xc_ptr": "*fp32", "C": "i32",
            "OFF": "i32", "stride_p": "i32", "W": "constexpr", "BLOCK": "constexpr", "BIAS": "constexpr"}
