"""ModernBERT (`modern-bert`: gte-modernbert, modernbert-embed, granite-embedding R2), as llama.cpp's.

src/models/modern-bert.cpp: pre-norm layers with LayerNorms without biases (layer 0 may have none:
the identity), q|k|v in one `attn_qkv`, NEOX rotary q/k whose base is `rope.freq_base` on global
layers and `rope.freq_base_swa` on windowed ones, symmetric windows of `attention.sliding_window`
(n_swa / 2 on each side) on every layer but each third one from layer 0 (or the file's pattern),
a gated FFN on one `ffn_up` of gate|up (GELU-tanh, or SiLU where `hidden_activation` says so), no
projection biases, a final LayerNorm. The embedding is LayerNormed, with no positions added.
GELU goes through ggml's float16 table (bert.py's `ggml_gelu`), as llama.cpp's CPU GEGLU does.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from slotserver.model.encoder.bert import ggml_gelu, rotary, rotate_qk
from slotserver.model.encoder.bert_spec import POOLING_IDS, _float, _int
from slotserver.model.encoder.packed_attention import PackedAttention
from slotserver.model.gguf_file import GGUFError, GGUFFile

ARCH = "modern-bert"
ACTIVATIONS = {"gelu": "gelu", "gelu_pytorch_tanh": "gelu", "gelu_new": "gelu", "silu": "silu", "swish": "silu"}


@dataclass(frozen=True)
class ModernBertSpec:
    n_layers: int
    d_model: int
    n_heads: int
    d_ff: int
    ctx_train: int
    norm_eps: float
    pooling: str
    rope_base: float
    rope_base_swa: float
    windows: tuple[int, ...]    # per layer: window in positions (0: global)
    act: str                    # "gelu" or "silu"

    @classmethod
    def from_gguf(cls, f: GGUFFile) -> "ModernBertSpec":
        md = f.metadata
        n_layers, act = _int(f, ARCH, "block_count"), str(md.get(f"{ARCH}.hidden_activation", "gelu"))
        if act not in ACTIVATIONS:
            raise GGUFError(f.path, f"{ARCH}.hidden_activation {act!r} is not supported ({', '.join(ACTIVATIONS)})")
        pooling = md.get(f"{ARCH}.pooling_type", 0)
        if pooling not in POOLING_IDS:
            raise GGUFError(f.path, f"metadata {ARCH}.pooling_type = {pooling!r} is not a pooling type (0-4)")
        if md.get(f"{ARCH}.rope.scaling.type", "none") != "none":   # bert.rotary computes unscaled angles
            raise GGUFError(f.path, f"{ARCH}.rope.scaling.type {md[f'{ARCH}.rope.scaling.type']!r} is not supported")
        n_swa = int(md.get(f"{ARCH}.attention.sliding_window", 0))
        pattern = md.get(f"{ARCH}.attention.sliding_window_pattern", 3)
        flags = [bool(p) for p in pattern] if isinstance(pattern, list) else \
            [pattern == 0 or i % pattern != 0 for i in range(n_layers)]   # llama.cpp: dense first
        d_model, n_heads = _int(f, ARCH, "embedding_length"), _int(f, ARCH, "attention.head_count")
        if d_model % n_heads or (d_model // n_heads) % 2:
            raise GGUFError(f.path, f"embedding_length {d_model} is not an even head size times head_count {n_heads}")
        return cls(n_layers, d_model, n_heads, _int(f, ARCH, "feed_forward_length"), _int(f, ARCH, "context_length"),
                   _float(f, ARCH, "attention.layer_norm_epsilon"), POOLING_IDS[pooling],
                   _float(f, ARCH, "rope.freq_base", 10000.0), _float(f, ARCH, "rope.freq_base_swa", 10000.0),
                   tuple(n_swa if w and n_swa > 0 else 0 for w in flags), ACTIVATIONS[act])


class ModernBertModel:
    """A loaded ModernBERT: `forward(seqs)` -> every token's final hidden state `[T, d]` float32."""

    def __init__(self, f: GGUFFile, spec: ModernBertSpec) -> None:
        self.spec, d, ff = spec, spec.d_model, spec.d_ff

        def t(name, shape):
            f.require(name, shape)
            return f.load_tensor(name)

        self.tok_embd = t("token_embd.weight", (len(f.metadata["tokenizer.ggml.tokens"]), d))
        self.embd_norm, self.out_norm = t("token_embd_norm.weight", (d,)), t("output_norm.weight", (d,))
        self.layers = [dict(attn_norm=t(f"blk.{i}.attn_norm.weight", (d,)) if f"blk.{i}.attn_norm.weight" in f.tensors
                            else None, qkv=t(f"blk.{i}.attn_qkv.weight", (3 * d, d)),
                            wo=t(f"blk.{i}.attn_output.weight", (d, d)), ffn_norm=t(f"blk.{i}.ffn_norm.weight", (d,)),
                            up=t(f"blk.{i}.ffn_up.weight", (2 * ff, d)), down=t(f"blk.{i}.ffn_down.weight", (d, ff)))
                       for i in range(spec.n_layers)]

    @torch.inference_mode()
    def forward(self, seqs: list[list[int]]) -> torch.Tensor:
        s, lengths = self.spec, [len(q) for q in seqs]
        positions = torch.cat([torch.arange(n) for n in lengths])                        # [T]
        x = self._norm(self.tok_embd[torch.tensor([t for q in seqs for t in q])], self.embd_norm)   # [T, d]
        hd = s.d_model // s.n_heads
        ropes = {b: rotary(positions, hd, b) for b in {s.rope_base, s.rope_base_swa}}
        attention = PackedAttention.of(lengths)
        for i, lw in enumerate(self.layers):
            h = x if lw["attn_norm"] is None else self._norm(x, lw["attn_norm"])
            qkv = rotate_qk(F.linear(h, lw["qkv"]), s.n_heads, *ropes[s.rope_base_swa if s.windows[i] else s.rope_base])
            x = x + F.linear(attention.attend(qkv, s.n_heads, s.windows[i] // 2 if s.windows[i] else None), lw["wo"])
            g, u = F.linear(self._norm(x, lw["ffn_norm"]), lw["up"]).chunk(2, dim=-1)  # [T, d_ff] each
            x = x + F.linear((ggml_gelu(g) if s.act == "gelu" else F.silu(g)) * u, lw["down"])
        return self._norm(x, self.out_norm)

    def _norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x, (self.spec.d_model,), weight, None, self.spec.norm_eps)
