"""attention: causal attention of a ragged batch of query chunks against a strided KV cache.

Covers decode (one query per sequence) and (chunked) prefill (many) with one code path. The KV
comes as logical `[stream, cell, kv_head, head_dim]` views (any strides, see `StridedKV`); GQA is
handled by folding the query heads of one KV head into the query axis, so K/V are never repeated.
Each sequence only reads `max_kv` cells of its stream: the masked tail past the longest sequence is
never touched. When the batch's streams are contiguous (sequence defragmentation), K/V are sliced,
not gathered.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from slotserver.batch import AttnMeta, Batch, SeqChunk
from slotserver.kv_spec import StridedKV

OP = "attention"
TOL = {torch.float32: 1e-4, torch.bfloat16: 3e-2}


def reference(q: torch.Tensor, kv: StridedKV, meta: AttnMeta, scale: float) -> torch.Tensor:
    """q: [tokens, q_heads, head_dim]; kv: logical [streams, cells, kv_heads, head_dim] -> like q.

    Plain per-sequence, per-query loops in float32: obviously correct, slow.
    """
    k, v = _dequant(kv.k, kv.k_scale), _dequant(kv.v, kv.v_scale)
    out = torch.empty(q.shape, dtype=torch.float32, device=q.device)
    group = q.shape[1] // k.shape[2]
    for b in range(meta.n_seqs):
        stream, n_q, n_kv = (int(meta.seq_streams[b]), int(meta.q_lens[b]), int(meta.kv_lens[b]))
        keys = k[stream, :n_kv].float().repeat_interleave(group, dim=1)    # [n_kv, q_heads, dim]
        vals = v[stream, :n_kv].float().repeat_interleave(group, dim=1)
        for j in range(n_q):
            row, pos = int(meta.q_offsets[b]) + j, n_kv - n_q + j
            scores = torch.einsum("hd,khd->hk", q[row].float(), keys[: pos + 1]) * scale
            out[row] = torch.einsum("hk,khd->hd", scores.softmax(dim=-1), vals[: pos + 1])
    return out.to(q.dtype)


def cpu(q: torch.Tensor, kv: StridedKV, meta: AttnMeta, scale: float) -> torch.Tensor:
    n_seq, max_q, max_kv = meta.n_seqs, meta.max_q, meta.max_kv
    q_heads, dim = q.shape[1], q.shape[2]
    kv_heads = kv.k.shape[2]
    group = q_heads // kv_heads
    keys = _dequant(_select(kv.k, meta), _select_scale(kv.k_scale, meta), q.dtype)  # [B, kv_heads, L, dim]
    vals = _dequant(_select(kv.v, meta), _select_scale(kv.v_scale, meta), q.dtype)
    qp = q[meta.pad_index]                                              # [B, max_q, q_heads, dim]
    qp = qp.view(n_seq, max_q, kv_heads, group, dim).permute(0, 2, 3, 1, 4)
    qp = qp.reshape(n_seq, kv_heads, group * max_q, dim)
    key_pos = torch.arange(max_kv, device=q.device)
    mask = key_pos.view(1, 1, 1, max_kv) <= meta.pad_positions.view(n_seq, 1, max_q, 1)
    mask = mask.repeat(1, 1, group, 1)                                  # [B, 1, group*max_q, L]
    out = F.scaled_dot_product_attention(qp, keys, vals, attn_mask=mask, scale=scale)
    out = out.view(n_seq, kv_heads, group, max_q, dim).permute(0, 3, 1, 2, 4)
    return out.reshape(n_seq * max_q, q_heads, dim)[meta.valid_rows]  # [tokens, q_heads, dim]


def _select(cache: torch.Tensor, meta: AttnMeta) -> torch.Tensor:
    """The batch's streams, first `max_kv` cells, as `[B, kv_heads, max_kv, dim]`."""
    if meta.stream_base is not None:
        part = cache[meta.stream_base: meta.stream_base + meta.n_seqs, : meta.max_kv]
    else:
        part = cache[:, : meta.max_kv].index_select(0, meta.seq_streams)
    return part.transpose(1, 2)


def _select_scale(scale: torch.Tensor | None, meta: AttnMeta) -> torch.Tensor | None:
    """Scales `[streams, cells, kv_heads]` of the batch -> `[B, kv_heads, max_kv, 1]`."""
    return None if scale is None else _select(scale.unsqueeze(-1), meta)


def _dequant(x: torch.Tensor, scale: torch.Tensor | None, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    if scale is None:
        return x if x.dtype == dtype else x.to(dtype)
    if scale.dim() == x.dim() - 1:
        scale = scale.unsqueeze(-1)
    return (x.float() * scale.float()).to(dtype)


def example_inputs(gen: torch.Generator, dtype: torch.dtype) -> tuple:
    """A random ragged batch (mixed decode and prefill chunks) on shuffled streams."""
    kv_heads = int(torch.randint(1, 4, (), generator=gen))
    group = int(torch.randint(1, 4, (), generator=gen))
    dim = int(torch.randint(1, 5, (), generator=gen)) * 8
    n_streams, n_cells = 6, 40
    n_seq = int(torch.randint(1, n_streams + 1, (), generator=gen))
    streams = torch.randperm(n_streams, generator=gen)[:n_seq].tolist()
    chunks = []
    for s in streams:
        start = int(torch.randint(0, 30, (), generator=gen))
        n_new = 1 if torch.rand((), generator=gen) < 0.5 else int(torch.randint(1, 10, (), generator=gen))
        chunks.append(SeqChunk(stream=s, start=start, tokens=[0] * n_new))
    meta = Batch.build(chunks).attn
    q = torch.randn(sum(len(c.tokens) for c in chunks), kv_heads * group, dim, generator=gen)
    k = torch.randn(n_streams, n_cells, kv_heads, dim, generator=gen)
    v = torch.randn(n_streams, n_cells, kv_heads, dim, generator=gen)
    return q.to(dtype), StridedKV(k.to(dtype), v.to(dtype)), meta, 1 / math.sqrt(dim)
