"""A decoder layer's attention branch: from its q|k|v projection to the heads' output, with the
layer's K/V written into the cache on the way.

What each architecture adds to llama's (rope of q and k, write, attend) is a switch of the
`ModelSpec`: q/k RMSNorm per head (qwen3, gemma3) or over the whole projection (olmoe; under --tp
a callable holding this rank's slice), mistral3's q temperature past the trained context,
the layer's window, soft-cap and sinks (the attention kernels take them from AttnMeta), and
qwen35's output gate. deepseek2's latent attention is a branch of its own (mla_attention.py). The model's layer loop (model.py), the lean Triton body (lean_step.py) and
the GEMV body (gemv_step.py) all call `attention`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from slotserver.model.block_ops import as_dtype
from slotserver.model.mla_attention import mla_attention
from slotserver.model.sigmoid_gate import sigmoid_gate
from slotserver.runtime.batch import Batch

if TYPE_CHECKING:
    from slotserver.model.model import LlamaModel
    from slotserver.model.weights import LayerWeights


def attention(model: "LlamaModel", i: int, lw: "LayerWeights", qkv: torch.Tensor, batch: Batch, cache,
              cos: torch.Tensor, sin: torch.Tensor, temp: torch.Tensor | None = None) -> torch.Tensor:
    """Layer i's attention from its q|k|v projection: K/V written, attention -> [tokens, heads * hd]
    in the matmul dtype; temp: a per-token q scale (mistral3, `q_temperature`)."""
    s, ops, n = model.spec, model.kernels, batch.n_tokens
    if s.mla is not None:   # deepseek2's latent attention (no q temperature: refused at load)
        return mla_attention(model, i, lw, qkv, batch, cache, cos, sin)
    q_size, kv_size = s.n_heads * s.head_dim, s.n_kv_heads * s.head_dim
    qkv = as_dtype(qkv, model.dtype)   # [tokens, q_size + 2*kv_size]
    if lw.q_norm is not None and s.qk_norm_full:   # olmoe: RMSNorm over all of q, all of k
        q = _full_norm(ops, qkv[:, :q_size], lw.q_norm, s.norm_eps).view(n, s.n_heads, s.head_dim)
        k = _full_norm(ops, qkv[:, q_size: q_size + kv_size], lw.k_norm, s.norm_eps)
        k = k.view(n, s.n_kv_heads, s.head_dim)
        q, k = ops.rope(q, cos, sin), ops.rope(k, cos, sin)
    elif lw.q_norm is None:
        qk = ops.rope(qkv[:, : q_size + kv_size].view(n, s.n_heads + s.n_kv_heads, s.head_dim), cos, sin)
        q, k = qk[:, : s.n_heads], qk[:, s.n_heads:]        # [tokens, heads, hd], [tokens, kv_heads, hd]
    elif s.qk_norm_late:   # hunyuan-dense: rope, then the per-head RMSNorm
        qk = ops.rope(qkv[:, : q_size + kv_size].view(n, s.n_heads + s.n_kv_heads, s.head_dim), cos, sin)
        q, k = ops.rms_norm(qk[:, : s.n_heads], lw.q_norm, s.norm_eps), ops.rms_norm(qk[:, s.n_heads:], lw.k_norm,
                                                                                   s.norm_eps)
    else:  # per-head RMSNorm before rope (qwen3, gemma3)
        q = ops.rms_norm(qkv[:, :q_size].view(n, s.n_heads, s.head_dim), lw.q_norm, s.norm_eps)  # views:
        k = ops.rms_norm(qkv[:, q_size: q_size + kv_size].view(n, s.n_kv_heads, s.head_dim), lw.k_norm,
                         s.norm_eps)                         # no copy a step graph would refuse
        q, k = ops.rope(q, cos, sin), ops.rope(k, cos, sin)
    if temp is not None:
        q = (q.float() * temp[:, None, None]).to(q.dtype)  # [tokens, heads, hd]
    v = qkv[:, q_size + kv_size: q_size + 2 * kv_size].view(n, s.n_kv_heads, s.head_dim)
    layer = s.kv_index(i)
    cache.write(layer, batch.token_streams, batch.positions, k, v)
    kv = cache.view(layer)                                   # StridedKV or PagedKV
    attend = ops.paged_attention if kv.paged else ops.attention
    a = attend(q, kv, batch.attn.with_layer(s.window(i), s.attn_softcap, lw.sinks), s.q_scale)  # [T, heads, hd]
    a = a.reshape(n, q_size)
    if s.attn_gate:   # qwen35: each head's output times sigmoid of its gate (after v in qkv)
        a = sigmoid_gate(a, qkv[:, q_size + 2 * kv_size:])
    act = model.weights.act_dtype
    return as_dtype(a, act)


def q_temperature(model: "LlamaModel", batch: Batch) -> torch.Tensor | None:
    """mistral3's per-token q scale where some position passes the original context
    (`LlamaModel._q_temp`), once per forward: llama.cpp's build_inp_attn_scale, in double as its
    float + 1.0 promotes."""
    if not model._q_temp(batch):
        return None
    s = model.spec
    return ((torch.floor(batch.positions.double() / float(s.rope.file_ctx)) + 1.0).log()
            * s.attn_temp_scale + 1.0).float()


def _full_norm(ops, x: torch.Tensor, norm, eps: float) -> torch.Tensor:
    """olmoe's RMSNorm of all of q (or k): `norm` its weight, or under --tp a callable holding this
    rank's slice (parallel/split_norm.py: the sum of squares over every rank's heads)."""
    return ops.rms_norm(x, norm, eps) if isinstance(norm, torch.Tensor) else norm(x, ops, eps)
