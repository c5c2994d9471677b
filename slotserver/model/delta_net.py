"""One gated delta-net layer over a ragged batch (Qwen3.5's linear attention), in float32 torch.

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

Steps 1 and 5 are row-wise over the whole batch; 2-4 need each sequence's tokens in order. A
decode step (one token per sequence) on contiguous streams (`AttnMeta.stream_base`, what defrag
keeps) runs them batched over the sequences; otherwise each sequence runs its tokens one after
another. The state lives in runtime/recurrent_state.py, one row per KV stream.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from slotserver.runtime.batch import Batch
from slotserver.runtime.recurrent_state import RecurrentState


def delta_net(spec, params, proj: torch.Tensor, batch: Batch, state: RecurrentState, layer: int,
              eps: float) -> torch.Tensor:
    """proj: [T, proj_dim] the layer's in-projection of every row -> [T, value_dim] float32, the
    gated and normed outputs (before the out-projection); the streams' states updated."""
    r = spec.recurrent
    proj = proj.float()
    mixed, z, beta, alpha = proj.split([r.conv_dim, r.value_dim, r.n_v_heads, r.n_v_heads], dim=1)
    b = torch.sigmoid(beta)                                              # [T, Hv]
    g = F.softplus(alpha + params.dt_bias) * params.a                    # [T, Hv] (< 0)
    row = state.row[layer]
    meta = batch.attn
    streams, q_lens, offsets = meta.seq_streams.tolist(), meta.q_lens.tolist(), meta.q_offsets.tolist()
    out = torch.empty(proj.shape[0], r.value_dim, device=proj.device)   # [T, Hv * dv]
    base = meta.stream_base
    if max(q_lens) == 1 and base is not None:   # decode on contiguous streams: batched, in place
        rows, span = torch.tensor(offsets, device=proj.device), slice(base, base + len(streams))
        conv_out, state.conv[row, span] = _convolve(state.conv[row, span], mixed[rows][:, None], params.conv)
        q, k, v = _qkv(r, conv_out[:, 0], eps)                           # [B, Hv, dk], [B, Hv, dk], [B, Hv, dv]
        out[rows] = _step(state.ssm[row, span], q, k, v, g[rows], b[rows]).reshape(len(streams), -1)
    else:   # each sequence's tokens in order, on its state in place
        for stream, n, first in zip(streams, q_lens, offsets):
            rows = slice(first, first + n)
            conv_out, state.conv[row, stream] = _convolve(state.conv[row, stream][None], mixed[rows][None], params.conv)
            q, k, v = _qkv(r, conv_out[0], eps)                          # [n, Hv, dk], ..., [n, Hv, dv]
            s = state.ssm[row, stream]                                   # [Hv, dk, dv], a view
            o = torch.empty(n, r.n_v_heads, r.head_v, device=proj.device)
            for t in range(n):
                o[t] = _step(s, q[t], k[t], v[t], g[first + t], b[first + t])
            out[rows] = o.reshape(n, -1)
    o = out.view(-1, r.n_v_heads, r.head_v)
    normed = o * torch.rsqrt(o.pow(2).mean(-1, keepdim=True) + eps) * params.norm      # [T, Hv, dv]
    return (normed * F.silu(z.view(-1, r.n_v_heads, r.head_v))).reshape(-1, r.value_dim)


def _convolve(conv_state: torch.Tensor, x: torch.Tensor, taps: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """conv_state [B, d_conv-1, C], x [B, n, C], taps [C, d_conv] -> (silu(conv) [B, n, C], new state)."""
    window = torch.cat([conv_state, x], dim=1)                           # [B, n + d_conv - 1, C]
    d_conv = taps.shape[1]
    frames = window.unfold(1, d_conv, 1)                                 # [B, n, C, d_conv]
    y = (frames * taps).sum(-1)                                          # ggml_ssm_conv: sum_j in[t+j] w[j]
    return F.silu(y), window[:, -(d_conv - 1):].clone()


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
    (a contiguous view of the states). s [..., dk, dv]; q, k [..., dk]; v [..., dv]; g, b [...] ->
    o [..., dv]. Batched products over the heads: elementwise products and sums took 22 ms a layer
    at Qwen3.5-0.8B's shapes (16 heads of 128), these 0.2 ms (playground/delta_net_speed.py)."""
    dk, dv = s.shape[-2:]
    s3 = s.view(-1, dk, dv)                                              # [N, dk, dv]
    k3 = k.reshape(-1, 1, dk)
    s3.mul_(torch.exp(g).reshape(-1, 1, 1))
    delta = (v.reshape(-1, 1, dv) - torch.bmm(k3, s3)) * b.reshape(-1, 1, 1)   # b (v - S^T k)  [N, 1, dv]
    s3.baddbmm_(k3.transpose(1, 2), delta)                               # S += k delta^T
    return torch.bmm(q.reshape(-1, 1, dk), s3).view(v.shape)             # S^T q
