"""A latent-attention layer's attention branch (deepseek2, mla_spec.py): from the fused input projection
to the heads' values, the layer's latent row written into the cache on the way.

llama.cpp's absorbed path (src/models/deepseek2.cpp, `is_mla`), as multi-query attention over one
KV head of `rope + kv_lora_rank` values per cell:

    q      = q_b(RMSNorm(q_a x)) or attn_q x               # [T, H, nope + rope]
    c, kpe = RMSNorm(kv_a x [:rank]), kv_a x [rank:]        # [T, rank], [T, rope]
    Q      = [rope(q[..., nope:]) | W_kb q[..., :nope]]     # [T, H, rope + rank]
    K = V  = [rope(kpe) | c]                                # [T, 1, rope + rank]
    out    = W_vb attend(Q, K, V)[..., rope:]               # [T, H, v_dim] -> attn_output

The rotated part goes first (llama.cpp puts it last): a KV shift re-rotates a key's first rope_dim
values (model/rope_shift.py), and the attention is the same sum in another order. The per-head
products with W_kb / W_vb (`_per_head`) are the moe_matmul kernel's per-slot products where they
are blocks it repacks, each token's slots its heads (mla_layer.py's `heads` ids), and the joins
are C calls (row_join.py): such a decode step is C calls only and replays from a step graph. With
float W_kb / W_vb (dequantized weights, F16/BF16 or other formats, a legacy attn_kv_b) they are
torch's float32 batched products, and those steps run as usual (step_graph.py refuses a capture
with torch computation).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from slotserver.model.block_ops import as_dtype
from slotserver.model.row_join import join_rows
from slotserver.runtime.batch import Batch

if TYPE_CHECKING:
    from slotserver.model.model import LlamaModel
    from slotserver.model.weights import LayerWeights


def mla_attention(model: "LlamaModel", i: int, lw: "LayerWeights", qkv: torch.Tensor, batch: Batch, cache,
                  cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Layer i's attention from its fused projection qkv [T, q_width + rank + rope] -> [T, heads * v_dim]
    in the matmul dtype, the layer's K/V rows written."""
    s, m, w, ops, n = model.spec, model.spec.mla, lw.mla, model.kernels, batch.n_tokens
    h, q_width = s.n_heads, m.q_width(s.n_heads)
    q = qkv[:, :q_width]
    if w.q_b is not None:   # the low-rank q: RMSNorm, then attn_q_b
        q = model._mm(False, w.q_b, q, norm=w.q_a_norm)                  # [T, H * (nope + rope)]
    q = as_dtype(q, model.dtype).reshape(n, h, m.qk_dim)                  # [T, H, nope + rope]
    kv = as_dtype(qkv[:, q_width:], model.dtype)                          # [T, rank + rope]
    latent = ops.rms_norm(kv[:, : m.kv_lora_rank], w.kv_a_norm, s.norm_eps)    # [T, rank]
    k_pe = ops.rope(kv[:, m.kv_lora_rank:].reshape(n, 1, m.rope), cos, sin)   # [T, 1, rope]
    q_pe = ops.rope(q[:, :, m.nope:], cos, sin)                                # [T, H, rope]
    q_lat = _per_head(ops, q[:, :, : m.nope], w.k_b, w.heads)                   # [T, H, rank]
    q = join_rows(q_pe, as_dtype(q_lat, q_pe.dtype))                           # [T, H, rope + rank]
    k = join_rows(k_pe, as_dtype(latent, k_pe.dtype).view(n, 1, m.kv_lora_rank))   # [T, 1, rope + rank]
    layer = s.kv_index(i)
    cache.write(layer, batch.token_streams, batch.positions, k, k)
    view = cache.view(layer)                                                   # StridedKV or PagedKV
    attend = ops.paged_attention if view.paged else ops.attention
    a = attend(q, view, batch.attn.with_layer(s.window(i), s.attn_softcap, lw.sinks), s.q_scale)   # [T, H, row]
    out = _per_head(ops, a[:, :, m.rope:], w.v_b, w.heads)                      # [T, H, v_dim]
    return as_dtype(out.reshape(n, h * m.v_dim), model.weights.act_dtype)


def _per_head(ops, x: torch.Tensor, w, heads: torch.Tensor) -> torch.Tensor:
    """x [T, H, K] times each head's matrix -> [T, H, N]: moe_matmul's per-slot products (slot j = head
    j; w Experts) on blocks, else torch's batched product in float32 (w [H, N, K])."""
    if isinstance(w, torch.Tensor):
        return torch.einsum("thk,hnk->thn", x.float(), w)
    n, h = x.shape[0], x.shape[1]
    ids = heads[:n] if n <= heads.shape[0] else torch.arange(h).expand(n, h).contiguous()   # [T, H]
    return ops.moe_matmul(x, w, ids)
