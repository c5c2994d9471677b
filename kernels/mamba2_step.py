"""mamba2_step: a forward step's rows through a Mamba-2 layer (Granite 4.0-H's, llama.cpp's
build_mamba2_layer), between the layer's in- and out-projections: each sequence's new tokens in
order, decode rows and prompt rows alike.

`(out, conv, ssm) = mamba2_step(proj, conv, ssm, streams, offsets, lens, taps, bias, dt_bias, a, d, norm,
n_group, eps)`:
- proj [T, P] float32 or bf16: each row's in-projection, z [D] | xBC [C] | dt [H], D = H hd (the
  heads' inputs), C = D + 2 G N (x | B | C, before the convolution), G = n_group;
- sequence b owns rows offsets[b] .. offsets[b] + lens[b] - 1 (its tokens in order) and continues
  stream streams[b] (all three [B] int64; streams distinct);
- conv [S, d_conv - 1, C] and ssm [S, H, N, hd] float32: every stream's convolution inputs and
  state, both updated in place;
- taps [C, d_conv], bias [C] (the convolution's), dt_bias [H], a [H] (-exp(A_log)), d [H] (the skip),
  norm [D] (the group RMSNorm's weight, group after group): float32; norm None: no group norm
  (Falcon-H1's layers, `mamba_rms_norm` false: llama.cpp skips it where the file has no ssm_norm);
- out [T, D] in proj's dtype. Returned with the two states (validation compares the updates too).

The math, per token: xBC = silu(bias + the causal depthwise convolution over the stream's last
d_conv - 1 inputs and this one); per head h (group g = h / (H / G), heads of a group adjacent, as
ggml's repeat_interleave): dt = softplus(dt_h + dt_bias[h]), S_h = exp(dt a[h]) S_h + B_g (dt x_h)^T,
y_h = S_h^T C_g + d[h] x_h, times silu(z_h); then y RMS-normed over each group's D / G values,
times norm (where given).

Why a kernel: as kernels/delta_net_step.py (a hybrid's recurrent layer in one call a step, which a
step graph replays; a prompt's scan with each head's N x hd state in cache from token to token).

TOL: the reference computes the same float32 math in another order (its sums by torch); the C
kernel's sigmoids use the prelude's polynomial exp (2e-7 relative). bf16: the output's rounding.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton as _triton
import triton.language as tl

from slotserver.runtime import kernel_parts, native

_cc = kernel_parts.load(__file__, "_causal_conv.py")   # the convolution (a part shared with delta_net_step)

OP = "mamba2_step"
TOL = {torch.float32: 2e-5, torch.bfloat16: 1e-2}
FUSES = ("no_norm",)   # optional behaviours every implementation takes (a model without ssm_norm asks for it)
MAX_HD, MAX_CONV = 512, 8   # head sizes and convolution widths the C kernel takes; others take the reference


def reference(proj: torch.Tensor, conv: torch.Tensor, ssm: torch.Tensor, streams: torch.Tensor, offsets: torch.Tensor,
              lens: torch.Tensor, taps: torch.Tensor, bias: torch.Tensor, dt_bias: torch.Tensor, a: torch.Tensor,
              d: torch.Tensor, norm: torch.Tensor | None, n_group: int,
              eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Token by token, each sequence's rows in order, its heads at once."""
    (H, N, hd), C, G = ssm.shape[1:], taps.shape[0], n_group
    D = H * hd
    p, out = proj.float(), torch.empty(proj.shape[0], D, device=proj.device)
    for s, first, n in zip(streams.tolist(), offsets.tolist(), lens.tolist()):
        for t in range(first, first + n):
            z, xbc, dt = p[t].split([D, C, H])
            window = torch.cat([conv[s], xbc[None]])                       # [d_conv, C]
            conv[s] = window[1:]
            x, b, c = F.silu((window * taps.T).sum(0) + bias).split([D, G * N, G * N])
            b, c = (u.view(G, N).repeat_interleave(H // G, 0) for u in (b, c))   # [H, N]
            dt = F.softplus(dt + dt_bias)                                  # [H]
            x = x.view(H, hd)
            state = ssm[s] * torch.exp(dt * a)[:, None, None] + b[:, :, None] * (x * dt[:, None])[:, None, :]
            ssm[s] = state                                                 # [H, N, hd]
            y = (torch.einsum("hn,hnp->hp", c, state) + d[:, None] * x) * F.silu(z.view(H, hd))
            y = y.reshape(G, D // G)
            if norm is not None:
                y = y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + eps) * norm.view(G, -1)
            out[t] = y.reshape(-1)
    return out.to(proj.dtype), conv, ssm


# causal_conv.c (the convolution, shared with the other recurrent kernel) in front of mamba2_step.c
NATIVE_C = native.joined(__file__, [("causal_conv.c", native.c_source(__file__, "causal_conv.c")),
                                    ("mamba2_step.c", native.c_source(__file__, "mamba2_step.c"))])
_LIB = native.build("mamba2_step", NATIVE_C, origin=None, strict=True)
native.signature(_LIB, "mamba2_step", 13, 9, (native.ctypes.c_float,) + (native.ctypes.c_int,) * 3, replay=True)


def cpu(proj: torch.Tensor, conv: torch.Tensor, ssm: torch.Tensor, streams: torch.Tensor, offsets: torch.Tensor,
        lens: torch.Tensor, taps: torch.Tensor, bias: torch.Tensor, dt_bias: torch.Tensor, a: torch.Tensor,
        d: torch.Tensor, norm: torch.Tensor | None, n_group: int,
        eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One C call (mamba2_step.c: the convolution, each (sequence, head)'s scan, the group norm;
    threads over each); else `reference`."""
    args = (proj, conv, ssm, streams, offsets, lens, taps, bias, dt_bias, a, d, norm, n_group, eps)
    if (_LIB is None or proj.dtype not in (torch.float32, torch.bfloat16) or proj.dim() != 2 or proj.stride(1) != 1
            or not proj.is_cpu or ssm.shape[3] > MAX_HD or taps.shape[1] > MAX_CONV
            or not all(t.is_cpu and t.dtype == torch.int64 and t.is_contiguous() for t in (streams, offsets, lens))
            or not all(t.is_cpu and t.dtype == torch.float32 and t.is_contiguous()
                       for t in (conv, ssm, taps, bias, dt_bias, a, d) + (() if norm is None else (norm,)))):
        return reference(*args)
    T, (H, N, hd) = proj.shape[0], ssm.shape[1:]
    out = torch.empty(T, H * hd, dtype=proj.dtype)                         # [T, D]
    rc = _LIB.mamba2_step(proj.data_ptr(), conv.data_ptr(), ssm.data_ptr(), streams.data_ptr(), offsets.data_ptr(),
                          lens.data_ptr(), taps.data_ptr(), bias.data_ptr(), dt_bias.data_ptr(), a.data_ptr(),
                          d.data_ptr(), 0 if norm is None else norm.data_ptr(), out.data_ptr(), streams.shape[0], T, proj.stride(0),
                          out.stride(0), n_group, H, N, hd, taps.shape[1], eps, native.is_bf16(proj),
                          native.is_bf16(out), torch.get_num_threads())
    assert rc == 0, f"mamba2_step: failed ({rc})"
    return out, conv, ssm


@_triton.jit
def _scan_kernel(proj_ptr, xc_ptr, ssm_ptr, streams_ptr, offsets_ptr, lens_ptr, dt_ptr, a_ptr, d_ptr, y_ptr, C, H,
                 G, N, HD, stride_p, BN: tl.constexpr, BP: tl.constexpr):
    """Program (sequence b, head h, block of BP of its hd columns), its rows in order: the [N, BP]
    block of the head's state in registers from the first token to the last, decayed and written a
    token; y (with the skip) times silu(z) -> y_ptr (float32 for the group norm; without one, the
    output itself in its dtype)."""
    b, h = tl.program_id(0).to(tl.int64), tl.program_id(1)
    ns, ps = tl.arange(0, BN), tl.program_id(2) * BP + tl.arange(0, BP)
    nm, pm = ns < N, ps < HD
    D, g = H * HD, h // (H // G)
    sp = ssm_ptr + ((tl.load(streams_ptr + b) * H + h) * N) * HD + ns[:, None] * HD + ps[None, :]
    s = tl.load(sp, mask=nm[:, None] & pm[None, :], other=0.0)            # [BN, BP]
    dt_b, a, dd = tl.load(dt_ptr + h), tl.load(a_ptr + h), tl.load(d_ptr + h)
    first = tl.load(offsets_ptr + b)
    for t in range(first, first + tl.load(lens_ptr + b)):
        row = xc_ptr + t * C
        x = tl.load(row + h * HD + ps, mask=pm, other=0.0)
        bv = tl.load(row + D + g * N + ns, mask=nm, other=0.0)
        cv = tl.load(row + D + G * N + g * N + ns, mask=nm, other=0.0)
        z0 = tl.load(proj_ptr + t * stride_p + D + C + h).to(tl.float32) + dt_b
        dt = tl.where(z0 > 20.0, z0, tl.log(1.0 + tl.exp(tl.minimum(z0, 20.0))))
        s = tl.exp(dt * a) * s + bv[:, None] * (x * dt)[None, :]
        y = tl.sum(s * cv[:, None], 0) + dd * x
        z = tl.load(proj_ptr + t * stride_p + h * HD + ps, mask=pm, other=0.0).to(tl.float32)
        tl.store(y_ptr + t * D + h * HD + ps, (y * z * tl.sigmoid(z)).to(y_ptr.dtype.element_ty), mask=pm)
    tl.store(sp, s, mask=nm[:, None] & pm[None, :])


@_triton.jit
def _norm_kernel(y_ptr, norm_ptr, out_ptr, D, GS, stride_o, eps, BG: tl.constexpr):
    """Program (row t, group g): its GS values RMS-normed, times norm."""
    t, g = tl.program_id(0).to(tl.int64), tl.program_id(1)
    ks = tl.arange(0, BG)
    m = ks < GS
    y = tl.load(y_ptr + t * D + g * GS + ks, mask=m, other=0.0)
    y = y * (1.0 / tl.sqrt(tl.sum(y * y, 0) / GS + eps)) * tl.load(norm_ptr + g * GS + ks, mask=m, other=0.0)
    tl.store(out_ptr + t * stride_o + g * GS + ks, y.to(out_ptr.dtype.element_ty), mask=m)


SCAN_COLUMNS = 32   # a scan program's share of a head's hd columns (N x 32 floats in registers)


def triton(proj: torch.Tensor, conv: torch.Tensor, ssm: torch.Tensor, streams: torch.Tensor, offsets: torch.Tensor,
           lens: torch.Tensor, taps: torch.Tensor, bias: torch.Tensor, dt_bias: torch.Tensor, a: torch.Tensor,
           d: torch.Tensor, norm: torch.Tensor | None, n_group: int,
           eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Same contract as `cpu`, in three launches: the convolution, the scan (a program per sequence,
    head and SCAN_COLUMNS of its columns), the group norm (a program per row and group); without a
    group norm (falcon-h1) the scan writes the output rows itself, two launches."""
    assert proj.stride(1) == 1 and conv.is_contiguous() and ssm.is_contiguous(), "proj rows, states contiguous"
    T, B, (H, N, hd), (C, d_conv) = proj.shape[0], streams.shape[0], ssm.shape[1:], taps.shape
    D = H * hd
    out = torch.empty(T, D, dtype=proj.dtype, device=proj.device)
    if T and B:
        seqs = [x.to(torch.int64).contiguous() for x in (streams, offsets, lens)]
        xc = torch.empty(T, C, dtype=torch.float32, device=proj.device)
        y = out if norm is None else torch.empty(T, D, dtype=torch.float32, device=proj.device)   # [T, D]
        _cc.conv_silu_kernel[(B, _triton.cdiv(C, _cc.BLOCK))](proj, conv, taps.contiguous(), bias, *seqs, xc, C, D,
                                                               proj.stride(0), W=d_conv - 1, BLOCK=_cc.BLOCK, BIAS=True)
        bp = min(SCAN_COLUMNS, _triton.next_power_of_2(hd))
        _scan_kernel[(B, H, _triton.cdiv(hd, bp))](proj, xc, ssm, *seqs, dt_bias, a, d, y, C, H, n_group, N, hd,
                                                   proj.stride(0), BN=_triton.next_power_of_2(N), BP=bp)
        gs = D // n_group
        if norm is not None:
            _norm_kernel[(T, n_group)](y, norm, out, D, gs, out.stride(0), eps, BG=_triton.next_power_of_2(gs))
    return out, conv, ssm


def example_inputs(gen: torch.Generator, dtype: torch.dtype) -> tuple:
    """A few sequences of 1-5 tokens (a fifth of the cases one of 12-24) on scattered streams, 1-2
    groups of 1-2 heads each, head sizes and state sizes with and without a power of two,
    convolutions 2-4 wide, strong and weak decays; a quarter of the cases (3 streams) without the
    group norm."""
    def pick(*xs):
        return xs[int(torch.randint(len(xs), (), generator=gen))]

    G, per, hd, N, d_conv = pick(1, 2), pick(1, 2), pick(8, 16, 40), pick(4, 8, 12), pick(2, 3, 4)
    H, S = G * per, int(torch.randint(2, 6, (), generator=gen))
    B, D = int(torch.randint(1, S + 1, (), generator=gen)), G * per * hd
    C = D + 2 * G * N
    lens = torch.where(torch.rand(B, generator=gen) < 0.6, torch.randint(1, 6, (B,), generator=gen), 1)   # [B]
    if torch.rand((), generator=gen) < 0.2:   # now and then a prompt of many tokens: the scan's long path
        lens[0] = int(torch.randint(12, 25, (), generator=gen))
    proj = torch.randn(int(lens.sum()), D + C + H, generator=gen)
    proj[:, -H:] += 2 * torch.randn(H, generator=gen)                      # dt: decays from ~1 to ~e^-8
    return (proj.to(dtype), torch.randn(S, d_conv - 1, C, generator=gen), 0.3 * torch.randn(S, H, N, hd, generator=gen),
            torch.randperm(S, generator=gen)[:B], lens.cumsum(0) - lens, lens,
            0.5 * torch.randn(C, d_conv, generator=gen), 0.1 * torch.randn(C, generator=gen),
            torch.randn(H, generator=gen), -torch.rand(H, generator=gen) - 0.5, torch.randn(H, generator=gen),
            None if S == 3 else 1 + 0.1 * torch.randn(D, generator=gen), G, 1e-5)


def bench_inputs(device: str, small: bool = False) -> list[tuple[str, tuple]]:
    """`lab check --time`: Granite 4.0-H-Tiny's Mamba-2 layer (48 heads of 64, d_state 128, 1 group,
    width 4): decode at b=1 and 32, and one 2048-token prompt."""
    G, H, hd, N, d_conv = (1, 2, 8, 8, 4) if small else (1, 48, 64, 128, 4)
    D, out = H * hd, []
    C = D + 2 * G * N
    for B, n in (((2, 1), (1, 5)) if small else ((1, 1), (32, 1), (1, 2048))):
        lens = torch.full((B,), n, device=device)
        args = (torch.randn(B * n, D + C + H, device=device, dtype=torch.bfloat16),
                torch.randn(B, d_conv - 1, C, device=device), torch.randn(B, H, N, hd, device=device),
                torch.arange(B, device=device), lens.cumsum(0) - lens, lens, torch.randn(C, d_conv, device=device),
                torch.randn(C, device=device), torch.randn(H, device=device), -torch.rand(H, device=device) - 0.5,
                torch.randn(H, device=device), torch.ones(D, device=device), G, 1e-5)
        out.append((f"b={B} x {n} tokens, {H}x{N}x{hd}", args))
    return out


_SCAN_SIG = {"proj_ptr": "*bf16", "xc_ptr": "*fp32", "ssm_ptr": "*fp32", **_cc.SEQS, "dt_ptr": "*fp32", "a_ptr": "*fp32",
             "d_ptr": "*fp32", "y_ptr": "*fp32", "C": "i32", "H": "i32", "G": "i32", "N": "i32", "HD": "i32",
             "stride_p": "i32", "BN": "constexpr", "BP": "constexpr"}
_NORM_SIG = {"y_ptr": "*fp32", "norm_ptr": "*fp32", "out_ptr": "*bf16", "D": "i32", "GS": "i32", "stride_o": "i32",
             "eps": "fp32", "BG": "constexpr"}
AOT = [(_cc.conv_silu_kernel, _cc.signature("bf16"), {"W": 3, "BLOCK": _cc.BLOCK, "BIAS": True},
        {"aligned": ("proj_ptr", "conv_ptr", "xc_ptr", "C")}),
       *[(_scan_kernel, _SCAN_SIG | {"y_ptr": y}, {"BN": 128, "BP": SCAN_COLUMNS},   # *bf16: no group norm (falcon-h1)
          {"aligned": ("proj_ptr", "xc_ptr", "ssm_ptr", "y_ptr", "C", "stride_p")}) for y in ("*fp32", "*bf16")],
       (_norm_kernel, _NORM_SIG, {"BG": 4096}, {"aligned": ("y_ptr", "out_ptr", "D", "stride_o")})]
