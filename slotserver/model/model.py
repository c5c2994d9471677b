"""The llama-family transformer: one forward per step over a ragged batch.

No Python loop over sequences inside the layers: every layer runs its matmuls on all `[tokens]`
rows of the batch at once, writes the new K/V rows into the layout, and calls the attention kernel
once with the batch's `AttnMeta`. Ops come from a `KernelSet` (swappable at step boundaries).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import torch

from slotserver.model.batch import Batch
from slotserver.model.gguf_file import GGUFFile
from slotserver.lab.kernel_set import KernelSet
from slotserver.model.spec import ModelSpec
from slotserver.model.rope_table import RopeTable
from slotserver.model.weights import ModelWeights, Progress, WeightFormat, load_weights


@dataclass
class LlamaModel:
    spec: ModelSpec
    weights: ModelWeights
    kernels: KernelSet
    rope: RopeTable
    dtype: torch.dtype
    path: Path | None = None

    @classmethod
    def load(cls, path: str | Path, dtype: torch.dtype = torch.float32,
             kernels: KernelSet | None = None, max_pos: int | None = None,
             progress: Progress | None = None, fmt: WeightFormat = WeightFormat()) -> "LlamaModel":
        f = GGUFFile.open(path)
        return cls.from_file(f, ModelSpec.from_gguf(f), dtype, kernels, max_pos, progress, fmt)

    @classmethod
    def from_file(cls, f: GGUFFile, spec: ModelSpec, dtype: torch.dtype,
                  kernels: KernelSet | None = None, max_pos: int | None = None,
                  progress: Progress | None = None, fmt: WeightFormat = WeightFormat()) -> "LlamaModel":
        kernels = kernels or KernelSet.load()
        q4 = kernels.modules["q4_matmul"].module if "q4_matmul" in kernels.modules else None
        weights = load_weights(f, spec, dtype, progress, fmt, q4)
        rope = RopeTable(spec, max_pos or spec.ctx_train, weights.rope_freqs)
        return cls(spec, weights, kernels, rope, dtype, f.path)

    @torch.inference_mode()
    def forward(self, batch: Batch, cache) -> torch.Tensor:
        """Run the batch, writing its K/V into `cache`; -> float32 logits `[len(logits_rows), vocab]`."""
        s, w, ops = self.spec, self.weights, self.kernels
        n = batch.n_tokens
        cos, sin = self.rope.lookup(batch.positions)             # [tokens, rope_dim/2]
        x = w.embed(batch.tokens)                                # [tokens, d_model] residual in f32
        q_size, kv_size = s.n_heads * s.head_dim, s.n_kv_heads * s.head_dim
        scale = 1.0 / math.sqrt(s.head_dim)
        for i, lw in enumerate(w.layers):
            h = ops.rms_norm(x, lw.attn_norm, s.norm_eps).to(w.act_dtype)
            qkv = lw.qkv(h, ops).to(self.dtype)                 # [tokens, q_size + 2*kv_size]
            qk = ops.rope(qkv[:, : q_size + kv_size].view(n, s.n_heads + s.n_kv_heads, s.head_dim), cos, sin)
            q, k = qk[:, : s.n_heads], qk[:, s.n_heads:]        # [tokens, heads, hd], [tokens, kv_heads, hd]
            v = qkv[:, q_size + kv_size:].view(n, s.n_kv_heads, s.head_dim)
            cache.write(i, batch.token_streams, batch.positions, k, v)
            kv = cache.view(i)                                   # StridedKV or PagedKV
            attend = ops.paged_attention if kv.paged else ops.attention
            a = attend(q, kv, batch.attn, scale)                 # [tokens, heads, hd]
            x = x + lw.wo(a.reshape(n, q_size).to(w.act_dtype), ops)
            h = ops.rms_norm(x, lw.ffn_norm, s.norm_eps).to(w.act_dtype)
            x = x + lw.down(ops.silu_mul(lw.gate_up(h, ops)), ops)
        x = ops.rms_norm(x[batch.logits_rows], w.out_norm, s.norm_eps).to(w.act_dtype)
        return w.output(x, ops).float()                          # [rows, vocab]
