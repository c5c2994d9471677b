"""delta_net_step: one token on each of B sequences through a gated delta-net layer (Qwen3.5's
linear attention, llama.cpp's qwen35 graph), between the layer's in- and out-projections.

`(out, conv, ssm) = delta_net_step(proj, conv, ssm, streams, taps, dt_bias, a, norm, n_k, eps)`:
- proj [B, P] float32 or bf16: each row's in-projection, mixed [C] | z [H dv] | beta [H] | alpha [H],
  C = 2 n_k dk + H dv (q | k | v before the convolution);
- conv [S, d_conv - 1, C] and ssm [S, H, dk, dv] float32: every stream's convolution inputs and
  delta-rule state; row b continues stream streams[b] ([B] int64, distinct), both updated in place;
- taps [C, d_conv], dt_bias [H], a [H] (-exp(A_log)), norm [dv]: float32 weights;
- out [B, H dv] in proj's dtype: the gated, normed outputs. Returned with the two states, so that
  validation compares the updated states too (a wrong update shows only at the next token).

The math (model/delta_net.py's module docstring, one token): the causal depthwise convolution over
the stream's last d_conv - 1 inputs and this one, SiLU; q, k L2-normed per head (x / sqrt(sum x^2 +
eps)), q scaled by 1/sqrt(dk), v head h reading q/k head h % n_k; g = softplus(alpha + dt_bias) a,
b = sigmoid(beta); S = e^g S; S += k (b (v - S^T k))^T; o = S^T q; o RMS-normed over dv, times
norm and silu(z).

Why a kernel: a hybrid decode step ran ~15 small torch ops a delta-net layer (0.8 ms a layer of
Qwen3.5-0.8B at b=1 on 2 cores, 18 such layers), and torch code keeps a step out of a step graph
(slotserver/model/step_graph.py). As one C call per layer, reading each state once and writing it
once, the step replays from a step graph like a dense model's; on CUDA two launches replace the
ops (the streams read from a tensor: no host sync). Prompts (several tokens a sequence) stay in
model/delta_net.py: the token loop or the chunked form.

TOL: the reference computes the same float32 math in another order (it decays S before reading it;
the kernels read S once and apply the decay to the products): rounding apart. bf16: the output's
rounding.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton as _triton
import triton.language as tl

from slotserver.runtime import native

OP = "delta_net_step"
TOL = {torch.float32: 2e-5, torch.bfloat16: 1e-2}
MAX_D = 512   # head sizes the C kernel takes (its stack arrays); larger ones take the reference


def reference(proj: torch.Tensor, conv: torch.Tensor, ssm: torch.Tensor, streams: torch.Tensor, taps: torch.Tensor,
              dt_bias: torch.Tensor, a: torch.Tensor, norm: torch.Tensor, n_k: int,
              eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    B, (H, dk, dv), key = proj.shape[0], ssm.shape[1:], n_k * ssm.shape[2]
    C, idx = taps.shape[0], streams.long()
    mixed, z, beta, alpha = proj.float().split([C, H * dv, H, H], dim=1)
    window = torch.cat([conv[idx], mixed[:, None]], dim=1)                # [B, d_conv, C]
    conv[idx] = window[:, 1:]
    x = F.silu((window * taps.T).sum(1))                                   # [B, C]
    q, k, v = x.split([key, key, H * dv], dim=1)
    q, k = (t.view(B, n_k, dk) for t in (q, k))
    q, k = (t * torch.rsqrt(t.pow(2).sum(-1, keepdim=True) + eps) for t in (q, k))
    q, k = (t.repeat(1, H // n_k, 1) for t in (q * dk ** -0.5, k))        # [B, H, dk]: head h <- h % n_k
    g = F.softplus(alpha + dt_bias) * a                                    # [B, H]
    s = ssm[idx] * torch.exp(g)[..., None, None]                           # [B, H, dk, dv]
    delta = (v.view(B, H, dv) - torch.einsum("bhk,bhkv->bhv", k, s)) * torch.sigmoid(beta)[..., None]
    s = s + k[..., None] * delta[..., None, :]
    ssm[idx] = s
    o = torch.einsum("bhk,bhkv->bhv", q, s)                                # [B, H, dv]
    o = o * torch.rsqrt(o.pow(2).mean(-1, keepdim=True) + eps) * norm
    return (o * F.silu(z.view(B, H, dv))).reshape(B, H * dv).to(proj.dtype), conv, ssm


NATIVE_C = native.c_source(__file__, "delta_net_step.c")
_LIB = native.build("delta_net_step", NATIVE_C, origin=native.c_path(__file__, "delta_net_step.c"), strict=True)
native.signature(_LIB, "delta_net_step", 9, 8, (native.ctypes.c_float,) + (native.ctypes.c_int,) * 3, replay=True)
_FLOATS = (torch.float32, torch.bfloat16)


def _fits(proj, conv, ssm, streams, taps, dt_bias, a, norm) -> bool:
    """The C kernel's inputs: CPU, unit-stride proj rows, contiguous float32 states and weights, int64 streams."""
    ok = _LIB is not None and proj.dtype in _FLOATS and proj.dim() == 2 and proj.stride(1) == 1 \
        and streams.dtype == torch.int64 and streams.is_contiguous() and max(ssm.shape[2:]) <= MAX_D
    return ok and all(t.is_cpu and t.dtype == torch.float32 and t.is_contiguous()
                      for t in (conv, ssm, taps, dt_bias, a, norm)) and proj.is_cpu and streams.is_cpu


def cpu(proj: torch.Tensor, conv: torch.Tensor, ssm: torch.Tensor, streams: torch.Tensor, taps: torch.Tensor,
        dt_bias: torch.Tensor, a: torch.Tensor, norm: torch.Tensor, n_k: int,
        eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One C call (delta_net_step.c: the convolution, then each (row, head)'s state read once and
    updated once, threads over both); else `reference`."""
    if not _fits(proj, conv, ssm, streams, taps, dt_bias, a, norm):
        return reference(proj, conv, ssm, streams, taps, dt_bias, a, norm, n_k, eps)
    B, (H, dk, dv) = proj.shape[0], ssm.shape[1:]
    out = torch.empty(B, H * dv, dtype=proj.dtype)                         # [B, H dv]
    rc = _LIB.delta_net_step(proj.data_ptr(), conv.data_ptr(), ssm.data_ptr(), streams.data_ptr(), taps.data_ptr(),
                             dt_bias.data_ptr(), a.data_ptr(), norm.data_ptr(), out.data_ptr(), B, proj.stride(0),
                             out.stride(0), n_k, H, dk, dv, taps.shape[1], eps, native.is_bf16(proj),
                             native.is_bf16(out), torch.get_num_threads())
    assert rc == 0, f"delta_net_step: failed ({rc})"
    return out, conv, ssm


@_triton.jit
def _conv_kernel(proj_ptr, conv_ptr, taps_ptr, streams_ptr, xc_ptr, C, stride_p, W: tl.constexpr,
                 BLOCK: tl.constexpr):
    """Program (row b, channel block): the convolution of the W stored inputs and this one, SiLU ->
    xc; the stream's stored inputs shift by one (each channel is this program's alone)."""
    b = tl.program_id(0).to(tl.int64)
    cs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    m = cs < C
    base = conv_ptr + tl.load(streams_ptr + b) * W * C + cs
    x = tl.load(proj_ptr + b * stride_p + cs, mask=m, other=0.0).to(tl.float32)
    y = tl.zeros([BLOCK], dtype=tl.float32)
    for j in tl.static_range(W):
        y += tl.load(base + j * C, mask=m, other=0.0) * tl.load(taps_ptr + cs * (W + 1) + j, mask=m, other=0.0)
    y += x * tl.load(taps_ptr + cs * (W + 1) + W, mask=m, other=0.0)
    for j in tl.static_range(W - 1):   # oldest first: read j + 1 before it is overwritten
        tl.store(base + j * C, tl.load(base + (j + 1) * C, mask=m, other=0.0), mask=m)
    tl.store(base + (W - 1) * C, x, mask=m)
    tl.store(xc_ptr + b * C + cs, y * tl.sigmoid(y), mask=m)


@_triton.jit
def _head_kernel(proj_ptr, xc_ptr, ssm_ptr, streams_ptr, dt_ptr, a_ptr, norm_ptr, out_ptr, C, H, NK, DK, DV,
                 stride_p, stride_o, eps, BK: tl.constexpr, BV: tl.constexpr, KB: tl.constexpr):
    """Program (row b, v head h): the head's [DK, DV] state in blocks of KB rows, read along k and q
    (pass 1), then decayed and updated (pass 2, its reads from L2); the output normed and gated.
    Why in row blocks: the whole 128 x 128 state in registers spilled at 8 warps (AOT, sm_90)."""
    b, h = tl.program_id(0).to(tl.int64), tl.program_id(1)
    ks, vs = tl.arange(0, BK), tl.arange(0, BV)
    vm = vs < DV
    qp, kp = xc_ptr + b * C + (h % NK) * DK, xc_ptr + b * C + NK * DK + (h % NK) * DK
    q, k = tl.load(qp + ks, mask=ks < DK, other=0.0), tl.load(kp + ks, mask=ks < DK, other=0.0)
    rq = (1.0 / tl.sqrt(tl.sum(q * q, 0) + eps)) * (1.0 / tl.sqrt(DK * 1.0))
    rk = 1.0 / tl.sqrt(tl.sum(k * k, 0) + eps)
    kq = tl.sum(k * q, 0) * rq * rk
    p = proj_ptr + b * stride_p + C
    beta = tl.sigmoid(tl.load(p + H * DV + h).to(tl.float32))
    z0 = tl.load(p + H * DV + H + h).to(tl.float32) + tl.load(dt_ptr + h)
    decay = tl.exp(tl.where(z0 > 20.0, z0, tl.log(1.0 + tl.exp(tl.minimum(z0, 20.0)))) * tl.load(a_ptr + h))
    state = ssm_ptr + ((tl.load(streams_ptr + b) * H + h) * DK) * DV
    kS, qS = tl.zeros([BV], dtype=tl.float32), tl.zeros([BV], dtype=tl.float32)
    for k0 in range(0, DK, KB):
        rows = k0 + tl.arange(0, KB)
        rm = rows < DK
        s = tl.load(state + rows[:, None] * DV + vs[None, :], mask=rm[:, None] & vm[None, :], other=0.0)
        kS += tl.sum(s * (tl.load(kp + rows, mask=rm, other=0.0) * rk)[:, None], 0)
        qS += tl.sum(s * (tl.load(qp + rows, mask=rm, other=0.0) * rq)[:, None], 0)
    delta = beta * (tl.load(xc_ptr + b * C + 2 * NK * DK + h * DV + vs, mask=vm, other=0.0) - decay * kS)   # [BV]
    o = decay * qS + kq * delta
    for k0 in range(0, DK, KB):
        rows = k0 + tl.arange(0, KB)
        rm = rows < DK
        sp = state + rows[:, None] * DV + vs[None, :]
        s = tl.load(sp, mask=rm[:, None] & vm[None, :], other=0.0)
        kr = tl.load(kp + rows, mask=rm, other=0.0) * rk
        tl.store(sp, decay * s + kr[:, None] * delta[None, :], mask=rm[:, None] & vm[None, :])
    o = o * (1.0 / tl.sqrt(tl.sum(o * o, 0) / DV + eps)) * tl.load(norm_ptr + vs, mask=vm, other=0.0)
    z = tl.load(p + h * DV + vs, mask=vm, other=0.0).to(tl.float32)
    tl.store(out_ptr + b * stride_o + h * DV + vs, (o * z * tl.sigmoid(z)).to(out_ptr.dtype.element_ty), mask=vm)


CONV_BLOCK = 512


def triton(proj: torch.Tensor, conv: torch.Tensor, ssm: torch.Tensor, streams: torch.Tensor, taps: torch.Tensor,
           dt_bias: torch.Tensor, a: torch.Tensor, norm: torch.Tensor, n_k: int,
           eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Same contract as `cpu`: the convolution (one program per row and channel block) into a
    float32 scratch, then one program per (row, head), its state in blocks of ~4096 floats."""
    assert proj.stride(1) == 1 and conv.is_contiguous() and ssm.is_contiguous(), "proj rows, states contiguous"
    B, (H, dk, dv), (C, d_conv) = proj.shape[0], ssm.shape[1:], taps.shape
    out = torch.empty(B, H * dv, dtype=proj.dtype, device=proj.device)
    if B:
        streams = streams.to(torch.int64).contiguous()
        xc = torch.empty(B, C, dtype=torch.float32, device=proj.device)
        _conv_kernel[(B, _triton.cdiv(C, CONV_BLOCK))](proj, conv, taps.contiguous(), streams, xc, C, proj.stride(0),
                                                        W=d_conv - 1, BLOCK=CONV_BLOCK)
        bk, bv = _triton.next_power_of_2(dk), _triton.next_power_of_2(dv)
        _head_kernel[(B, H)](proj, xc, ssm, streams, dt_bias, a, norm, out, C, H, n_k, dk, dv, proj.stride(0),
                             out.stride(0), eps, BK=bk, BV=bv, KB=min(bk, max(1, 4096 // bv)), num_warps=4)
    return out, conv, ssm


def example_inputs(gen: torch.Generator, dtype: torch.dtype) -> tuple:
    """A few sequences on scattered streams of a larger state, q/k heads shared by 1-2 v heads,
    head sizes with and without a power of two, convolutions 2-4 wide, strong and weak decays."""
    def pick(*xs):
        return xs[int(torch.randint(len(xs), (), generator=gen))]

    n_k, reps, dk, dv, d_conv = pick(1, 2), pick(1, 2), pick(8, 16, 32), pick(8, 16, 24), pick(2, 3, 4)
    H, S = n_k * reps, int(torch.randint(2, 7, (), generator=gen))
    B, C = int(torch.randint(1, S + 1, (), generator=gen)), 2 * n_k * dk + n_k * reps * dv
    proj = torch.randn(B, C + H * dv + 2 * H, generator=gen)
    proj[:, -H:] += 3 * torch.randn(H, generator=gen)                      # alpha: decays from ~1 to ~e^-5
    conv, ssm = torch.randn(S, d_conv - 1, C, generator=gen), 0.3 * torch.randn(S, H, dk, dv, generator=gen)
    return (proj.to(dtype), conv, ssm, torch.randperm(S, generator=gen)[:B], 0.5 * torch.randn(C, d_conv, generator=gen),
            torch.rand(H, generator=gen), -0.5 - torch.rand(H, generator=gen), 1 + 0.1 * torch.randn(dv, generator=gen),
            n_k, 1e-6)


def bench_inputs(device: str, small: bool = False) -> list[tuple[str, tuple]]:
    """`lab check --time`: Qwen3.5-0.8B's delta net (16 q/k and 16 v heads of 128, width 4) at b=1
    and b=32, one stream a row (the bytes counted are the states the step reads and writes)."""
    n_k, dk, dv, H, d_conv = (1, 8, 8, 2, 4) if small else (16, 128, 128, 16, 4)
    out = []
    for B in ((2,) if small else (1, 32)):
        C = 2 * n_k * dk + H * dv
        args = (torch.randn(B, C + H * dv + 2 * H, device=device, dtype=torch.bfloat16),
                torch.randn(B, d_conv - 1, C, device=device), torch.randn(B, H, dk, dv, device=device),
                torch.arange(B, device=device), torch.randn(C, d_conv, device=device), torch.rand(H, device=device),
                -torch.rand(H, device=device) - 0.5, torch.ones(dv, device=device), n_k, 1e-6)
        out.append((f"b={B} {H}x{dk}x{dv}", args))
    return out


_HEAD_SIG = {"proj_ptr": "*bf16", "xc_ptr": "*fp32", "ssm_ptr": "*fp32", "streams_ptr": "*i64", "dt_ptr": "*fp32",
             "a_ptr": "*fp32", "norm_ptr": "*fp32", "out_ptr": "*bf16", "C": "i32", "H": "i32", "NK": "i32",
             "DK": "i32", "DV": "i32", "stride_p": "i32", "stride_o": "i32", "eps": "fp32", "BK": "constexpr",
             "BV": "constexpr", "KB": "constexpr"}
_CONV_SIG = {"proj_ptr": "*bf16", "conv_ptr": "*fp32", "taps_ptr": "*fp32", "streams_ptr": "*i64", "xc_ptr": "*fp32",
             "C": "i32", "stride_p": "i32", "W": "constexpr", "BLOCK": "constexpr"}
_PTRS = ("proj_ptr", "xc_ptr", "ssm_ptr", "streams_ptr", "out_ptr", "C", "stride_p", "stride_o")
AOT = [(_conv_kernel, _CONV_SIG, {"W": 3, "BLOCK": CONV_BLOCK}, {"aligned": ("proj_ptr", "conv_ptr", "xc_ptr", "C")}),
       (_head_kernel, _HEAD_SIG, {"BK": 128, "BV": 128, "KB": 32}, {"num_warps": 4, "aligned": _PTRS}),
       (_head_kernel, {**_HEAD_SIG, "proj_ptr": "*fp32", "out_ptr": "*fp32"}, {"BK": 64, "BV": 64, "KB": 64},
        {"num_warps": 4, "aligned": _PTRS})]
