"""An embedding model built from a decoder's block but attending both ways (EmbeddingGemma), as llama.cpp's.

`gemma-embedding` (src/models/gemma-embedding.cpp) is gemma3's layer: the embedding scaled by
sqrt(d), per-head q/k RMSNorm then rope (windowed layers with their own base), post-attention and
post-FFN norms, the GELU-tanh gate; but its attention has no causal mask and no KV cache, and its
windows are symmetric: a token sees the keys within n_swa / 2 positions on either side. The weights
are the loaded `LlamaModel`'s (the usual loader, kernels and weight formats); only the attention
differs, so this module runs the layers itself, each sequence's attention apart (no padding), and
returns every token's final-normed state for pooling (encoder/pooling.py). The file's dense
projections (`dense_2`, `dense_3`: sentence-transformers' modules) apply after pooling
(`Embedder.dense`, as llama.cpp's build_dense_out).
"""

from __future__ import annotations

import torch

from slotserver.model.encoder.bert import ggml_gelu
from slotserver.model.block_ops import as_dtype
from slotserver.model.model import LlamaModel
from slotserver.model.weights import LayerWeights


def _geglu(gate_up: torch.Tensor) -> torch.Tensor:
    """gelu(gate) * up in float32 through ggml's float16 GELU table, as the BERT encoder (bert.py's
    ggml_gelu): llama.cpp's CPU GEGLU reads that table. The decoder's exact gelu_mul kernel put this
    fixture's vectors up to 3.6e-4 from llama-server's, the table ~1e-6 (one near a rounding
    boundary: 1.2e-4)."""
    g, u = gate_up.float().chunk(2, dim=-1)                                          # [T, d_ff] each
    return ggml_gelu(g) * u


class BidirectionalEncoder:
    """`forward(seqs)` over a bidirectional model's layers: final-normed hidden states `[T, d]`."""

    def __init__(self, model: LlamaModel) -> None:
        self.model = model
        self.ctx_train = model.spec.ctx_train
        self.d_model = model.spec.d_model

    @torch.inference_mode()
    def forward(self, seqs: list[list[int]]) -> torch.Tensor:
        """Token sequences -> float32 `[sum of lengths, d_model]`, each token's row, packed in order."""
        m, s, w = self.model, self.model.spec, self.model.weights
        lengths = [len(q) for q in seqs]
        tokens = torch.tensor([t for q in seqs for t in q])                              # [T]
        positions = torch.cat([torch.arange(n) for n in lengths])                        # [T]
        x = w.embed(tokens)                                                              # [T, d] f32
        if s.embed_scale != 1.0:
            x = x * s.embed_scale
        for i, lw in enumerate(w.layers):
            x = self._layer(i, lw, x, positions, lengths)
        return m.kernels.rms_norm(x, w.out_norm, s.norm_eps).float()

    def _layer(self, i: int, lw: LayerWeights, x: torch.Tensor, positions: torch.Tensor,
               lengths: list[int]) -> torch.Tensor:
        s, ops, act = self.model.spec, self.model.kernels, self.model.weights.act_dtype
        h = as_dtype(ops.rms_norm(x, lw.attn_norm, s.norm_eps), act)
        a = self._attention(i, lw, lw.qkv(h, ops), positions, lengths)                   # [T, heads * hd]
        x = x + ops.rms_norm(lw.wo(as_dtype(a, act), ops), lw.post_attn_norm, s.norm_eps)
        h = as_dtype(ops.rms_norm(x, lw.ffn_norm, s.norm_eps), act)
        y = lw.down(as_dtype(_geglu(lw.gate_up(h, ops)), act), ops)
        return x + ops.rms_norm(y, lw.post_ffn_norm, s.norm_eps)

    def _attention(self, i: int, lw: LayerWeights, qkv: torch.Tensor, positions: torch.Tensor,
                   lengths: list[int]) -> torch.Tensor:
        """q/k normed per head and rotated, then each sequence's softmax(q k^T / sqrt(hd)) v over
        every key (within the symmetric window on a windowed layer)."""
        s, ops, n = self.model.spec, self.model.kernels, qkv.shape[0]
        qs, kvs = s.n_heads * s.head_dim, s.n_kv_heads * s.head_dim
        qkv = as_dtype(qkv, torch.float32)
        q = ops.rms_norm(qkv[:, :qs].view(n, s.n_heads, s.head_dim), lw.q_norm, s.norm_eps)
        k = ops.rms_norm(qkv[:, qs:qs + kvs].view(n, s.n_kv_heads, s.head_dim), lw.k_norm, s.norm_eps)
        cos, sin = self.model.layer_ropes[i].lookup(positions)
        q, k = ops.rope(q, cos, sin), ops.rope(k, cos, sin)                              # [T, heads, hd]
        v = qkv[:, qs + kvs:].view(n, s.n_kv_heads, s.head_dim)
        out, start, half = [], 0, s.window(i) // 2
        for length in lengths:
            sl = slice(start, start + length)
            qh = q[sl].transpose(0, 1) * s.q_scale                                       # [heads, L, hd]
            kh = k[sl].repeat_interleave(s.group, dim=1).transpose(0, 1)
            vh = v[sl].repeat_interleave(s.group, dim=1).transpose(0, 1)
            scores = qh @ kh.transpose(1, 2)                                             # [heads, L, L]
            if s.window(i):
                pos = torch.arange(length)
                scores.masked_fill_((pos[None, :] - pos[:, None]).abs() > half, float("-inf"))
            out.append((scores.softmax(-1) @ vh).transpose(0, 1).reshape(length, qs))
            start += length
        return torch.cat(out)
