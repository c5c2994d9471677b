"""delta_net_step: a forward step's rows through a gated delta-net layer (Qwen3.5's linear
attention, llama.cpp's qwen35 graph), between the layer's in- and out-projections: each
sequence's new tokens in order, decode rows and prompt rows alike.

`(out, conv, ssm) = delta_net_step(proj, conv, ssm, streams, offsets, lens, taps, dt_bias, a, norm, n_k, eps)`:
- proj [T, P] float32 or bf16: each row's in-projection, mixed [C] | z [H dv] | beta [H] | alpha [H],
  C = 2 n_k dk + H dv (q | k | v before the convolution);
- sequence b owns rows offsets[b] .. offsets[b] + lens[b] - 1 (its tokens in order) and continues
  stream streams[b] (all three [B] int64; streams distinct);
- conv [S, d_conv - 1, C] and ssm [S, H, dk, dv] float32: every stream's convolution inputs and
  delta-rule state, both updated in place;
- taps [C, d_conv], dt_bias [H], a [H] (-exp(A_log)), norm [dv]: float32 weights;
- out [T, H dv] in proj's dtype: the gated, normed outputs. Returned with the two states, so that
  validation compares the updated states too (a wrong update shows only at the next token).

The math, per token (model/delta_net.py's module docstring): the causal depthwise convolution over
the stream's last d_conv - 1 inputs and this one, SiLU; q, k L2-normed per head (x / sqrt(sum x^2 +
eps)), q scaled by 1/sqrt(dk), v head h reading q/k head h % n_k; g = softplus(alpha + dt_bias) a,
b = sigmoid(beta); S = e^g S; S += k (b (v - S^T k))^T; o = S^T q; o RMS-normed over dv, times
norm and silu(z).

Why a kernel: a hybrid decode step ran ~15 small torch ops a delta-net layer (0.8 ms a layer of
Qwen3.5-0.8B at b=1 on 2 cores), and torch code keeps a step out of a step graph
(slotserver/model/step_graph.py). One C call per layer reads each state once and writes it once a
token; over a prompt each (sequence, head)'s 64 KB state stays in cache from token to token: a
512-token prompt takes 28-37 ms a layer of Qwen3.5-0.8B on 2 cores (avx512; playground/delta_net_speed.py),
where torch's chunked (WY) form of the delta rule, which this replaced, took 75 and its token loop
122 (measured with that script's earlier version, the same day). On
CUDA: a scan with each head's state in registers, blocks of its columns a program.

TOL: the reference computes the same float32 math in another order (it decays S before reading it;
the kernels read S once and apply the decay to the products; the C kernel's sigmoids use the
prelude's polynomial exp, 2e-7 relative): rounding apart. bf16: the output's rounding.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton as _triton
import triton.language as tl

from slotserver.runtime import kernel_parts, native

_cc = kernel_parts.load(__file__, "_causal_conv.py")   # the convolution (a part shared with mamba2_step, short_conv_step)

OP = "delta_net_step"
TOL = {torch.float32: 2e-5, torch.bfloat16: 1e-2}
MAX_D = 512   # head sizes the C kernel takes (its stack arrays); larger ones take the reference
MAX_CONV = 8  # convolution widths it takes (its transposed taps); wider ones take the reference


def reference(proj: torch.Tensor, conv: torch.Tensor, ssm: torch.Tensor, streams: torch.Tensor, offsets: torch.Tensor,
              lens: torch.Tensor, taps: torch.Tensor, dt_bias: torch.Tensor, a: torch.Tensor, norm: torch.Tensor,
              n_k: int, eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Token by token, each sequence's rows in order, its heads at once."""
    (H, dk, dv), key, C = ssm.shape[1:], n_k * ssm.shape[2], taps.shape[0]
    p, out = proj.float(), torch.empty(proj.shape[0], H * dv, device=proj.device)
    for s, first, n in zip(streams.tolist(), offsets.tolist(), lens.tolist()):
        for t in range(first, first + n):
            mixed, z, beta, alpha = p[t].split([C, H * dv, H, H])
            window = torch.cat([conv[s], mixed[None]])                     # [d_conv, C]
            conv[s] = window[1:]
            q, k, v = F.silu((window * taps.T).sum(0)).split([key, key, H * dv])
            q, k = (u.view(n_k, dk) * torch.rsqrt(u.view(n_k, dk).pow(2).sum(-1, keepdim=True) + eps) for u in (q, k))
            q, k = (u.repeat(H // n_k, 1) for u in (q * dk ** -0.5, k))    # [H, dk]: head h <- h % n_k
            state = ssm[s] * torch.exp(F.softplus(alpha + dt_bias) * a)[:, None, None]   # [H, dk, dv]
            delta = (v.view(H, dv) - torch.einsum("hk,hkv->hv", k, state)) * torch.sigmoid(beta)[:, None]
            ssm[s] = state = state + k[..., None] * delta[:, None, :]
            o = torch.einsum("hk,hkv->hv", q, state)                      # [H, dv]
            o = o * torch.rsqrt(o.pow(2).mean(-1, keepdim=True) + eps) * norm
            out[t] = (o * F.silu(z.view(H, dv))).reshape(-1)
    return out.to(proj.dtype), conv, ssm


# causal_conv.c (the convolution, shared with the other recurrent kernel) in front of delta_net_step.c
NATIVE_C = native.joined(__file__, [("causal_conv.c", native.c_source(__file__, "causal_conv.c")),
                                    ("delta_net_step.c", native.c_source(__file__, "delta_net_step.c"))])
_LIB = native.build("delta_net_step", NATIVE_C, origin=None, strict=True)
native.signature(_LIB, "delta_net_step", 11, 9, (native.ctypes.c_float,) + (native.ctypes.c_int,) * 3, replay=True)
_FLOATS = (torch.float32, torch.bfloat16)


def _fits(proj, conv, ssm, seqs, weights) -> bool:
    """The C kernel's inputs: CPU, unit-stride proj rows, contiguous float32 states and weights
    (taps first), contiguous int64 sequence tensors."""
    ok = _LIB is not None and proj.dtype in _FLOATS and proj.dim() == 2 and proj.stride(1) == 1 and proj.is_cpu \
        and max(ssm.shape[2:]) <= MAX_D and weights[0].shape[1] <= MAX_CONV
    return ok and all(t.is_cpu and t.dtype == torch.int64 and t.is_contiguous() for t in seqs) \
        and all(t.is_cpu and t.dtype == torch.float32 and t.is_contiguous() for t in (conv, ssm, *weights))


def cpu(proj: torch.Tensor, conv: torch.Tensor, ssm: torch.Tensor, streams: torch.Tensor, offsets: torch.Tensor,
        lens: torch.Tensor, taps: torch.Tensor, dt_bias: torch.Tensor, a: torch.Tensor, norm: torch.Tensor, n_k: int,
        eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One C call (delta_net_step.c: the convolution, then each (sequence, head) over its rows,
    the state read once and updated once a token; threads over both); else `reference`."""
    if not _fits(proj, conv, ssm, (streams, offsets, lens), (taps, dt_bias, a, norm)):
        return reference(proj, conv, ssm, streams, offsets, lens, taps, dt_bias, a, norm, n_k, eps)
    T, (H, dk, dv) = proj.shape[0], ssm.shape[1:]
    out = torch.empty(T, H * dv, dtype=proj.dtype)                         # [T, H dv]
    rc = _LIB.delta_net_step(proj.data_ptr(), conv.data_ptr(), ssm.data_ptr(), streams.data_ptr(), offsets.data_ptr(),
                             lens.data_ptr(), taps.data_ptr(), dt_bias.data_ptr(), a.data_ptr(), norm.data_ptr(),
                             out.data_ptr(), streams.shape[0], T, proj.stride(0), out.stride(0), n_k, H, dk, dv,
                             taps.shape[1], eps, native.is_bf16(proj), native.is_bf16(out), torch.get_num_threads())
    assert rc == 0, f"delta_net_step: failed ({rc})"
    return out, conv, ssm


@_triton.jit
def _scan_kernel(proj_ptr, xc_ptr, ssm_ptr, streams_ptr, offsets_ptr, lens_ptr, dt_ptr, a_ptr, o_ptr, C, H, NK, DK,
                 DV, stride_p, eps, BK: tl.constexpr, BV: tl.constexpr):
    """Program (sequence b, v head h, block of BV state columns), its rows in order: the [DK, BV]
    block of the head's state in registers from the first token to the last (loaded and stored
    once), read along k and q, decayed and updated a token; the un-normed outputs -> o (float32)."""
    b, h = tl.program_id(0).to(tl.int64), tl.program_id(1)
    ks, vs = tl.arange(0, BK), tl.program_id(2) * BV + tl.arange(0, BV)
    km, vm = ks < DK, vs < DV
    sp = ssm_ptr + ((tl.load(streams_ptr + b) * H + h) * DK) * DV + ks[:, None] * DV + vs[None, :]
    s = tl.load(sp, mask=km[:, None] & vm[None, :], other=0.0)            # [BK, BV]
    dt, a = tl.load(dt_ptr + h), tl.load(a_ptr + h)
    first = tl.load(offsets_ptr + b)
    for t in range(first, first + tl.load(lens_ptr + b)):
        x = xc_ptr + t * C
        q = tl.load(x + (h % NK) * DK + ks, mask=km, other=0.0)
        k = tl.load(x + NK * DK + (h % NK) * DK + ks, mask=km, other=0.0)
        q = q * ((1.0 / tl.sqrt(tl.sum(q * q, 0) + eps)) * (1.0 / tl.sqrt(DK * 1.0)))
        k = k * (1.0 / tl.sqrt(tl.sum(k * k, 0) + eps))
        p = proj_ptr + t * stride_p + C + H * DV
        beta = tl.sigmoid(tl.load(p + h).to(tl.float32))
        z0 = tl.load(p + H + h).to(tl.float32) + dt
        decay = tl.exp(tl.where(z0 > 20.0, z0, tl.log(1.0 + tl.exp(tl.minimum(z0, 20.0)))) * a)
        v = tl.load(x + 2 * NK * DK + h * DV + vs, mask=vm, other=0.0)
        delta = beta * (v - decay * tl.sum(s * k[:, None], 0))             # [BV]
        o = decay * tl.sum(s * q[:, None], 0) + tl.sum(k * q, 0) * delta
        s = decay * s + k[:, None] * delta[None, :]
        tl.store(o_ptr + t * H * DV + h * DV + vs, o, mask=vm)
    tl.store(sp, s, mask=km[:, None] & vm[None, :])


@_triton.jit
def _gate_kernel(proj_ptr, o_ptr, norm_ptr, out_ptr, C, H, DV, stride_p, stride_o, eps, BV: tl.constexpr):
    """Program (row t, head h): the head's output RMS-normed over DV, times norm and silu(z)."""
    t, h = tl.program_id(0).to(tl.int64), tl.program_id(1)
    vs = tl.arange(0, BV)
    vm = vs < DV
    o = tl.load(o_ptr + t * H * DV + h * DV + vs, mask=vm, other=0.0)
    o = o * (1.0 / tl.sqrt(tl.sum(o * o, 0) / DV + eps)) * tl.load(norm_ptr + vs, mask=vm, other=0.0)
    z = tl.load(proj_ptr + t * stride_p + C + h * DV + vs, mask=vm, other=0.0).to(tl.float32)
    tl.store(out_ptr + t * stride_o + h * DV + vs, (o * z * tl.sigmoid(z)).to(out_ptr.dtype.element_ty), mask=vm)


SCAN_COLUMNS = 32   # state columns a scan program holds: 128 x 32 floats, 32 registers a thread at 4 warps


def triton(proj: torch.Tensor, conv: torch.Tensor, ssm: torch.Tensor, streams: torch.Tensor, offsets: torch.Tensor,
           lens: torch.Tensor, taps: torch.Tensor, dt_bias: torch.Tensor, a: torch.Tensor, norm: torch.Tensor, n_k: int,
           eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Same contract as `cpu`, in three launches: the convolution (a program per sequence and
    channel block) into a float32 scratch, the scan (a program per sequence, head and block of
    SCAN_COLUMNS state columns), then the norm and gate (a program per row and head)."""
    assert proj.stride(1) == 1 and conv.is_contiguous() and ssm.is_contiguous(), "proj rows, states contiguous"
    T, B, (H, dk, dv), (C, d_conv) = proj.shape[0], streams.shape[0], ssm.shape[1:], taps.shape
    out = torch.empty(T, H * dv, dtype=proj.dtype, device=proj.device)
    if T and B:
        seqs = [x.to(torch.int64).contiguous() for x in (streams, offsets, lens)]
        xc = torch.empty(T, C, dtype=torch.float32, device=proj.device)
        o = torch.empty(T, H * dv, dtype=torch.float32, device=proj.device)
        grid = (B, _triton.cdiv(C, _cc.BLOCK))
        _cc.conv_silu_kernel[grid](proj, conv, taps.contiguous(), taps, *seqs, xc, C, 0, proj.stride(0), W=d_conv - 1,
                                   BLOCK=_cc.BLOCK, BIAS=False)
        bv = min(SCAN_COLUMNS, _triton.next_power_of_2(dv))
        _scan_kernel[(B, H, _triton.cdiv(dv, bv))](proj, xc, ssm, *seqs, dt_bias, a, o, C, H, n_k, dk, dv,
                                                   proj.stride(0), eps, BK=_triton.next_power_of_2(dk), BV=bv)
        _gate_kernel[(T, H)](proj, o, norm, out, C, H, dv, proj.stride(0), out.stride(0), eps,
                             BV=_triton.next_power_of_2(dv))
    return out, conv, ssm


def example_inputs(gen: torch.Generator, dtype: torch.dtype) -> tuple:
    """A few sequences of 1-5 tokens (a decode row, short prompts; a fifth of the cases one of 12-24)
    on scattered streams of a larger state, q/k heads shared by 1-2 v heads, head sizes with and
    without a power of two (and over a scan program's columns), convolutions 2-4 wide, strong and
    weak decays."""
    def pick(*xs):
        return xs[int(torch.randint(len(xs), (), generator=gen))]

    n_k, reps, dk, dv, d_conv = pick(1, 2), pick(1, 2), pick(8, 16, 32), pick(8, 24, 40), pick(2, 3, 4)
    H, S = n_k * reps, int(torch.randint(2, 6, (), generator=gen))
    B, C = int(torch.randint(1, S + 1, (), generator=gen)), 2 * n_k * dk + n_k * reps * dv
    lens = torch.where(torch.rand(B, generator=gen) < 0.6, torch.randint(1, 6, (B,), generator=gen), 1)   # [B]
    if torch.rand((), generator=gen) < 0.2:   # now and then a prompt of many tokens: the scan's long path
        lens[0] = int(torch.randint(12, 25, (), generator=gen))
    offsets = lens.cumsum(0) - lens
    proj = torch.randn(int(lens.sum()), C + H * dv + 2 * H, generator=gen)
    proj[:, -H:] += 3 * torch.randn(H, generator=gen)                      # alpha: decays from ~1 to ~e^-5
    conv, ssm = torch.randn(S, d_conv - 1, C, generator=gen), 0.3 * torch.randn(S, H, dk, dv, generator=gen)
    return (proj.to(dtype), conv, ssm, torch.randperm(S, generator=gen)[:B], offsets, lens,
            0.5 * torch.randn(C, d_conv, generator=gen), torch.rand(H, generator=gen),
            -0.5 - torch.rand(H, generator=gen), 1 + 0.1 * torch.randn(dv, generator=gen), n_k, 1e-6)


def bench_inputs(device: str, small: bool = False) -> list[tuple[str, tuple]]:
    """`lab check --time`: Qwen3.5-0.8B's delta net (16 q/k and 16 v heads of 128, width 4): decode
    at b=1 and b=32 (one stream a row: the bytes counted are the states read and written), and one
    2048-token prompt."""
    n_k, dk, dv, H, d_conv = (1, 8, 8, 2, 4) if small else (16, 128, 128, 16, 4)
    C, out = 2 * n_k * dk + H * dv, []
    for B, n in ((((2, 1), (1, 5)) if small else ((1, 1), (32, 1), (1, 2048)))):
        lens = torch.full((B,), n, device=device)
        args = (torch.randn(B * n, C + H * dv + 2 * H, device=device, dtype=torch.bfloat16),
                torch.randn(B, d_conv - 1, C, device=device), torch.randn(B, H, dk, dv, device=device),
                torch.arange(B, device=device), lens.cumsum(0) - lens, lens, torch.randn(C, d_conv, device=device),
                torch.rand(H, device=device), -torch.rand(H, device=device) - 0.5, torch.ones(dv, device=device),
                n_k, 1e-6)
        out.append((f"b={B} x {n} tokens, {H}x{dk}x{dv}", args))
    return out


_SCAN_SIG = {"proj_ptr": "*bf16", "xc_ptr": "*fp32", "ssm_ptr": "*fp32", **_cc.SEQS, "dt_ptr": "*fp32", "a_ptr": "*fp32",
             "o_ptr": "*fp32", "C": "i32", "H": "i32", "NK": "i32", "DK": "i32", "DV": "i32", "stride_p": "i32",
             "eps": "fp32", "BK": "constexpr", "BV": "constexpr"}
_GATE_SIG = {"proj_ptr": "*bf16", "o_ptr": "*fp32", "norm_ptr": "*fp32", "out_ptr": "*bf16", "C": "i32", "H": "i32",
             "DV": "i32", "stride_p": "i32", "stride_o": "i32", "eps": "fp32", "BV": "constexpr"}
AOT = [(_cc.conv_silu_kernel, _cc.signature("bf16"), {"W": 3, "BLOCK": _cc.BLOCK, "BIAS": False},
        {"aligned": ("proj_ptr", "conv_ptr", "xc_ptr", "C", "stride_p")}),
       (_scan_kernel, _SCAN_SIG, {"BK": 128, "BV": SCAN_COLUMNS},
        {"aligned": ("proj_ptr", "xc_ptr", "ssm_ptr", "o_ptr", "C", "stride_p")}),
       (_gate_kernel, _GATE_SIG, {"BV": 128}, {"aligned": ("proj_ptr", "o_ptr", "out_ptr", "C", "stride_p")})]
