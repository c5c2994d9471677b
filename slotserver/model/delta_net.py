"""One gated delta-net layer over a ragged batch (Qwen3.5's linear attention).

What llama.cpp's qwen35 graph computes (src/models/qwen35.cpp, delta-net-base.cpp), per sequence:

1. the in-projection (model.py, a plain matmul) gives per token q|k|v (`mixed`), z, beta, alpha;
2. `mixed` goes through a causal depthwise convolution of width d_conv over the sequence, whose
   first inputs are the last d_conv - 1 of the previous step (the conv state), then SiLU;
3. q and k are L2-normalized per head (x / sqrt(sum x^2 + eps)), q scaled by 1/sqrt(head_k), and
   repeated to the v heads tiled (v head h reads q/k head h % k_heads);
4. per token t and v head, with g = softplus(alpha + dt_bias) * a (a < 0) and b = sigmoid(beta),
   the state S [head_k, head_v] is decayed, corrected towards v along k, and read along q:

       S = exp(g) S;   S += k (b (v - S^T k))^T;   o = S^T q

5. o is RMS-normed per head (`norm`), times silu(z); the out-projection follows (model.py).

Steps 1 and 5 are row-wise over the whole batch; 2-4 need each sequence's tokens in order. A decode
step (one token per sequence), or a mixed step's leading decodes, runs 2-5 as one call of the
kernel set's `delta_net_step` (kernels/delta_net_step.py: C on the CPU, Triton on CUDA; the
streams read from a tensor, so a step graph replays it): 0.14-0.20 ms a layer at b=1 and Qwen3.5-0.8B's
shapes where these torch ops took 0.8 (2 cores; playground/delta_net_speed.py). Every other sequence
runs here, in float32 torch: its tokens one after another, or, from CHUNKED_FROM tokens, in chunks
of CHUNK (`_chunked`: the delta rule's WY form, as transformers' torch_chunk_gated_delta_rule and
llama.cpp's build_delta_net_chunking compute it): at those shapes a 512-token prompt takes 75 ms a
layer instead of the token loop's 122 (the layer with its convolution and norms), and the outputs
differ from the token loop's by float32 rounding (tests/test_delta_net.py). The states live in
runtime/recurrent_state.py, one row per KV stream.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from slotserver.runtime.batch import Batch
from slotserver.runtime.recurrent_state import RecurrentState, leading_decodes


@dataclass
class GdnParams:
    """A delta-net layer's weights besides its two matmuls (model/recurrent_layer.py)."""

    conv: torch.Tensor      # [conv_dim, d_conv] float32: the causal depthwise convolution's taps
    dt_bias: torch.Tensor   # [v_heads] float32
    a: torch.Tensor         # [v_heads] float32: -exp(A_log)
    norm: torch.Tensor      # [head_v] float32: RMSNorm weight of each head's output

    def run(self, spec, proj: torch.Tensor, batch: Batch, state: RecurrentState, layer: int, ops) -> torch.Tensor:
        """proj: [T, proj_dim] the layer's in-projection of every row -> [T, value_dim] in proj's
        dtype, the gated and normed outputs (before the out-projection); the streams' states updated.
        The leading one-token sequences (a decode step: all of them) are one call of the kernel
        set's delta_net_step (C, or Triton on CUDA); each other sequence runs `delta_net`."""
        r, row, head = spec.recurrent, state.row[layer], leading_decodes(batch.attn)
        nb = 0 if head is None else head.n_seqs
        if nb:
            decoded = ops.delta_net_step(proj[:nb], state.conv[row], state.ssm[row], head.seq_streams, self.conv,
                                         self.dt_bias, self.a, self.norm, r.n_k_heads, spec.norm_eps)[0]
            if nb == proj.shape[0]:
                return decoded
            rest = delta_net(r, self, proj[nb:], state, row, state.seqs[nb:], nb, spec.norm_eps)
            return torch.cat([decoded, rest.to(decoded.dtype)])
        return delta_net(r, self, proj, state, row, state.seqs, 0, spec.norm_eps).to(proj.dtype)


def delta_net(r, params: GdnParams, proj: torch.Tensor, state: RecurrentState, row: int,
              seqs: list[tuple[int, int, int]], first_row: int, eps: float) -> torch.Tensor:
    """The sequences `seqs` ((stream, tokens, first row), rows from `first_row` on: proj's row 0)
    each in order on its state, in float32 torch: r the model's RecurrentSpec; proj [T, proj_dim]
    -> [T, value_dim] float32."""
    mixed, z, beta, alpha = proj.float().split([r.conv_dim, r.value_dim, r.n_v_heads, r.n_v_heads], dim=1)
    b = torch.sigmoid(beta)                                              # [T, Hv]
    g = F.softplus(alpha + params.dt_bias) * params.a                    # [T, Hv] (< 0)
    q, k, v = _qkv(r, F.silu(conv_rows(state, row, seqs, first_row, mixed, params.conv)), eps)   # [T, Hv, dk], ..
    out = torch.empty_like(v)                                            # [T, Hv, dv]
    for stream, n, first in seqs:   # each sequence's tokens in order, on its state in place
        rows, s = slice(first - first_row, first - first_row + n), state.ssm[row, stream]   # s [Hv, dk, dv], a view
        if n >= CHUNKED_FROM:
            out[rows] = _chunked(s, q[rows], k[rows], v[rows], g[rows], b[rows])
        else:
            for t in range(rows.start, rows.stop):
                out[t] = _step(s, q[t], k[t], v[t], g[t], b[t])
    normed = out * torch.rsqrt(out.pow(2).mean(-1, keepdim=True) + eps) * params.norm   # [T, Hv, dv]
    return (normed * F.silu(z.view(-1, r.n_v_heads, r.head_v))).reshape(-1, r.value_dim)


def conv_rows(state: RecurrentState, row: int, seqs: list[tuple[int, int, int]], first_row: int, x: torch.Tensor,
              taps: torch.Tensor) -> torch.Tensor:
    """The causal convolution of the rows of x [T, C] (x's row 0: the batch's row `first_row`),
    each over its own sequence's earlier inputs (seqs: (stream, tokens, first row)), the streams'
    conv states (their last d_conv - 1 inputs) updated -> [T, C]."""
    assert state.seqs, "a recurrent layer runs inside RecurrentState.stepping"
    parts = []
    for stream, n, first in seqs:
        rows = x[first - first_row: first - first_row + n]
        conv, state.conv[row, stream] = causal_conv(state.conv[row, stream][None], rows[None], taps)
        parts.append(conv[0])
    return torch.cat(parts) if len(parts) > 1 else parts[0]


CHUNK = 64          # tokens a chunk of the WY form
CHUNKED_FROM = 16   # a sequence's tokens from which the chunked form runs (below: the token loop is faster)


def _chunked(s: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
             b: torch.Tensor) -> torch.Tensor:
    """The gated delta rule over n tokens in chunks of CHUNK; s [H, dk, dv] updated in place to the
    state after the last. q, k [n, H, dk]; v [n, H, dv]; g, b [n, H] -> o [n, H, dv].

    Within a chunk, with G the cumulative sums of g: the corrections the tokens make to each other
    are the lower-triangular system T = (I + tril(diag(b) K K^T o e^(G_i - G_j), -1))^-1, so
    U = T (b V) and W = T (b K e^G); then per chunk, from the state S at its start,
    V' = U - W S, O = (Q e^G) S + (Q K^T o decay, causal) V', S = e^(G_last) S + (K e^(G_last - G))^T V'."""
    n, heads = k.shape[:2]
    pad = (-n) % CHUNK

    def chunks(x: torch.Tensor) -> torch.Tensor:   # [n, H, ...] -> [H, n_chunks, CHUNK, ...]
        x = x.transpose(0, 1)
        if pad:
            x = F.pad(x, (0, 0) * (x.dim() - 2) + (0, pad))
        return x.reshape(heads, -1, CHUNK, *x.shape[2:])

    q, k, v, g, b = (chunks(x) for x in (q, k, v, g, b))
    g = g.cumsum(-1)                                                     # [H, N, C]
    kb = k * b[..., None]
    decay = _exp((g[..., :, None] - g[..., None, :]).tril()).tril()     # [H, N, C, C]: e^(G_i - G_j), i >= j
    eye = torch.eye(CHUNK, dtype=k.dtype, device=k.device)
    lower = (kb @ k.transpose(-1, -2) * decay).tril(-1)
    t = torch.linalg.solve_triangular(eye + lower, eye.expand_as(lower), upper=False, unitriangular=True)
    u, w = t @ (v * b[..., None]), t @ (kb * _exp(g)[..., None])         # [H, N, C, dv], [H, N, C, dk]
    causal = decay.new_ones(CHUNK, CHUNK, dtype=torch.bool).tril()
    out = torch.empty_like(u)
    for i in range(q.shape[1]):
        qi, ki, gi = q[:, i], k[:, i], g[:, i]
        v_new = u[:, i] - w[:, i] @ s                                    # [H, C, dv]
        inner = (qi @ ki.transpose(-1, -2) * decay[:, i]).masked_fill(~causal, 0)
        out[:, i] = (qi * _exp(gi)[..., None]) @ s + inner @ v_new
        last = gi[:, -1]
        s.mul_(_exp(last)[:, None, None]).add_((ki * _exp(last[:, None] - gi)[..., None]).transpose(-1, -2) @ v_new)
    return out.reshape(heads, -1, out.shape[-1])[:, :n].transpose(0, 1)


EXP_FLOOR = -30.0


def _exp(x: torch.Tensor) -> torch.Tensor:
    """e^x with x floored at EXP_FLOOR (e^-30 ~ 1e-13, below float32's resolution of any sum it joins).
    Why: a strongly decaying head's cumulative decays reach e^-100 and beyond, and the products of
    such values are denormal floats, which x86 computes very slowly: a 512-token prompt with decays
    of ~-3 a token took 714 ms a layer instead of 40, for outputs equal to the floor's to the bit
    of their float32 rounding (measured against the token loop: the same 4.8e-7 difference)."""
    return x.clamp_min(EXP_FLOOR).exp()


def causal_conv(conv_state: torch.Tensor, x: torch.Tensor, taps: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The causal depthwise convolution of both hybrids: conv_state [B, d_conv-1, C] (the inputs
    before x), x [B, n, C], taps [C, d_conv] -> (conv [B, n, C], the new state: the last d_conv-1 inputs)."""
    window = torch.cat([conv_state, x], dim=1)                           # [B, n + d_conv - 1, C]
    d_conv = taps.shape[1]
    frames = window.unfold(1, d_conv, 1)                                 # [B, n, C, d_conv]
    y = (frames * taps).sum(-1)                                          # ggml_ssm_conv: sum_j in[t+j] w[j]
    return y, window[:, -(d_conv - 1):].clone()


def _qkv(r, mixed: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """mixed [..., conv_dim] convolved -> q, k [..., Hv, dk] (L2-normed, q scaled, tiled to the v
    heads) and v [..., Hv, dv]."""
    q, k, v = mixed.split([r.key_dim, r.key_dim, r.value_dim], dim=-1)
    lead = mixed.shape[:-1]
    q, k = (t.reshape(*lead, r.n_k_heads, r.head_k) for t in (q, k))
    q, k = (t * torch.rsqrt(t.pow(2).sum(-1, keepdim=True) + eps) for t in (q, k))   # ggml: rms_norm(eps/n)/sqrt(n)
    q = q * (1.0 / r.head_k ** 0.5)
    reps = r.n_v_heads // r.n_k_heads
    if reps > 1:
        q, k = (t.repeat(*([1] * len(lead)), reps, 1) for t in (q, k))   # tiled: head h <- h % k_heads
    return q, k, v.reshape(*lead, r.n_v_heads, r.head_v)


def _step(s: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
          b: torch.Tensor) -> torch.Tensor:
    """One token of the gated delta rule on each of N = prod(leading dims) heads, s updated in place
    (a contiguous view of the states): a prompt's token loop. s [..., dk, dv]; q, k [..., dk];
    v [..., dv]; g, b [...] -> o [..., dv]. Batched products over the heads (elementwise products
    and sums took 100x longer at Qwen3.5-0.8B's shapes)."""
    dk, dv = s.shape[-2:]
    s3 = s.view(-1, dk, dv)                                              # [N, dk, dv]
    k3 = k.reshape(-1, 1, dk)
    s3.mul_(torch.exp(g).reshape(-1, 1, 1))
    delta = (v.reshape(-1, 1, dv) - torch.bmm(k3, s3)) * b.reshape(-1, 1, 1)   # b (v - S^T k)  [N, 1, dv]
    s3.baddbmm_(k3.transpose(1, 2), delta)                               # S += k delta^T
    return torch.bmm(q.reshape(-1, 1, dk), s3).view(v.shape)             # S^T q
