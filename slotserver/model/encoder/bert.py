"""BERT, the encoder llama.cpp serves embeddings and reranking with (src/models/bert.cpp), in plain torch.

One forward runs many sequences at once, their tokens packed into one `[T, d]` batch, and returns
every token's final hidden state; pooling (pooling.py) picks from those. The graph is llama.cpp's
`build_bert`:
```
x = tok_embd[t] + token_types[0] + pos_embd[p]          # token type 0 ("sentence A") for every token
x = LayerNorm(x)                                         # token_embd_norm
per layer (post-norm, every projection with its bias):
  a = attention(x Wq, x Wk, x Wv) Wo                     # bidirectional: no causal mask, no KV cache
  x = LayerNorm(a + x)                                   # attn_output_norm
  x = LayerNorm(GELU(x Wup) Wdown + x)                   # layer_output_norm; GELU: tanh form, as ggml_gelu
```
nomic-bert (BertSpec.rope_base, .gated): no position embeddings, q and k rotated (NEOX halves) by
their position in the sequence before attention, and the FFN is `SiLU(x Wgate) * (x Wup) Wdown`
without biases, as llama.cpp's `build_bert` does for LLM_ARCH_NOMIC_BERT.
Projections and norms run on the packed rows; attention pads each sequence (packed_attention.py).
Weights are dequantized to float32 at load (bert_weights.py): BERT embedders are small (MiniLM-L6 is
22M parameters), and llama.cpp computes these graphs in f32 activations too. `matmul_dtype` bfloat16
(`serve --dtype bfloat16`) runs the projections in bf16 with f32 accumulation (AMX or AVX512-BF16
where the CPU has them; ~4x faster matmuls on an AMX host) while norms, GELU and residuals stay f32.

`gelu_table`: ggml's CPU GELU reads a table of float16 values (`GGML_GELU_FP16`: the input rounded
to f16, the result stored in f16); with it on (the default) this forward does the same.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from slotserver.model.encoder.bert_spec import BertSpec
from slotserver.model.encoder.bert_weights import BertLayer, BertWeights, load_bert_weights, matmul_weights
from slotserver.model.encoder.packed_attention import PackedAttention
from slotserver.model.gguf_file import GGUFFile


def ggml_gelu(x: torch.Tensor) -> torch.Tensor:
    """ggml's CPU GELU: tanh form looked up in a float16 table (input and result rounded to f16; torch's
    half GELU computes in float and rounds), 0 at or below -10 and the identity at or above 10."""
    y = F.gelu(x.half(), approximate="tanh").float()
    return torch.where(x >= 10.0, x, y.masked_fill_(x <= -10.0, 0.0))


def rotary(positions: torch.Tensor, head_dim: int, base: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [T, head_dim / 2] float32 of each row's position: angle pos * base^(-2i / head_dim)
    (ggml_rope_ext's, computed in float64)."""
    inv = base ** (-2.0 * torch.arange(head_dim // 2, dtype=torch.float64) / head_dim)
    angles = torch.outer(positions.double(), inv)
    return angles.cos().float(), angles.sin().float()


def rotate_qk(qkv: torch.Tensor, n_heads: int, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """q|k|v [T, 3 d] with q and k rotated NEOX-style (pairs i, i + hd/2 of each head); a new tensor."""
    t, d = qkv.shape[0], qkv.shape[1] // 3
    qk = qkv[:, : 2 * d].reshape(t, 2 * n_heads, 2, -1)                              # [T, 2H, 2, hd/2]
    x0, x1 = qk[:, :, 0], qk[:, :, 1]
    c, s = cos[:, None], sin[:, None]                                                 # [T, 1, hd/2]
    rotated = torch.stack((x0 * c - x1 * s, x0 * s + x1 * c), dim=2).reshape(t, 2 * d)
    return torch.cat((rotated, qkv[:, 2 * d:]), dim=1)


class BertModel:
    """A loaded BERT encoder: `forward(seqs)` -> every token's final hidden state."""

    def __init__(self, spec: BertSpec, weights: BertWeights, gelu_table: bool = True,
                 matmul_dtype: torch.dtype = torch.float32) -> None:
        self.spec, self.weights, self.gelu_table = spec, weights, gelu_table
        self.matmul_dtype = matmul_dtype
        self.layers = matmul_weights(weights.layers, matmul_dtype)

    @classmethod
    def from_file(cls, f: GGUFFile, spec: BertSpec | None = None, gelu_table: bool = True,
                  matmul_dtype: torch.dtype = torch.float32) -> "BertModel":
        spec = spec or BertSpec.from_gguf(f)
        return cls(spec, load_bert_weights(f, spec), gelu_table, matmul_dtype)

    @torch.inference_mode()
    def forward(self, seqs: list[list[int]]) -> torch.Tensor:
        """Token sequences (each 1..ctx_train ids) -> float32 hidden states `[T, d]`, T the tokens of
        all sequences packed in order."""
        s, w = self.spec, self.weights
        lengths = [len(q) for q in seqs]
        tokens = torch.tensor([t for q in seqs for t in q])                           # [T]
        positions = torch.cat([torch.arange(n) for n in lengths])                     # [T]
        x = w.tok_embd[tokens] + w.type_row0                                           # [T, d]
        if w.pos_embd is not None:
            x = x + w.pos_embd[positions]
        x = F.layer_norm(x, (s.d_model,), *w.embd_norm, s.norm_eps)
        attention = PackedAttention.of(lengths)
        rope = rotary(positions, s.head_dim, s.rope_base) if s.rope_base else None
        for lw in self.layers:
            x = self._layer(lw, x, attention, rope)
        return x

    def _layer(self, lw: BertLayer, x: torch.Tensor, attention: PackedAttention,
               rope: tuple[torch.Tensor, torch.Tensor] | None) -> torch.Tensor:
        d, eps = self.spec.d_model, self.spec.norm_eps
        qkv = self._linear(x, lw.qkv, lw.qkv_b)                                        # [T, 3 d]
        if rope is not None:
            qkv = rotate_qk(qkv, self.spec.n_heads, *rope)
        a = attention.attend(qkv, self.spec.n_heads)                                   # [T, d]
        x = F.layer_norm(self._linear(a, lw.wo, lw.wo_b) + x, (d,), *lw.attn_norm, eps)
        if lw.gate is not None:                                                        # nomic-bert
            h = F.silu(self._linear(x, lw.gate, None)) * self._linear(x, lw.up, None)   # [T, d_ff]
        else:
            h = self._linear(x, lw.up, lw.up_b)                                        # [T, d_ff]
            h = ggml_gelu(h) if self.gelu_table else F.gelu(h, approximate="tanh")
        return F.layer_norm(self._linear(h, lw.down, lw.down_b) + x, (d,), *lw.out_norm, eps)

    def _linear(self, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
        """x @ w^T (+ b) in float32 out; bf16 inputs when the weights are bf16 (f32 accumulation)."""
        if w.dtype == torch.float32:
            return F.linear(x, w, b)
        y = F.linear(x.to(w.dtype), w).float()
        return y if b is None else y.add_(b)
