"""Load a llama-family model's tensors from a GGUF file into compute-dtype torch tensors.

Weights are dequantized one tensor at a time (the file itself is memory-mapped), so loading never
holds two full copies. q/k/v are fused into one `[q+2kv, d_model]` matrix and gate/up into one
`[2*d_ff, d_model]` matrix: fewer, larger matmuls per layer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import gguf
import torch

from slotserver.model.gguf_file import GGUFFile
from slotserver.model.linear import Linear
from slotserver.model.spec import ModelSpec

Progress = Callable[[int, int], None]


@dataclass(frozen=True)
class WeightFormat:
    """How matmul weights are kept (see `Linear`): dense only, int8 only, or both (auto)."""

    kind: str = "dense"
    int8_max_rows: int = 8    # with auto/auto4: rows (tokens) up to which the int8/int4 matmul is used
    output_max_rows: int = 4  # the same for the [vocab, d_model] output matmul
    native_max_rows: int = 32  # int4 layers: rows up to which the AMX kernel (slotserver.model.q4_matmul) is used

    # Why these thresholds (docs/performance.md; whole decode steps in the model on this CPU, bf16,
    # dense weights pre-blocked for oneDNN): the int8/int4 kernels cost ~linear in rows, the dense
    # GEMM ~flat. Layer matmuls: int4 wins below 8 rows (step 18 vs 30 ms at 2 rows), ties at 8-12,
    # dense wins at 16 (35-37 vs 48 ms). The 49152-row output matmul: dense already wins at 8 rows.


@dataclass
class LayerWeights:
    attn_norm: torch.Tensor      # [d_model]
    qkv: Linear                  # [(n_heads + 2*n_kv_heads) * head_dim, d_model] (+ bias)
    wo: Linear                   # [d_model, n_heads * head_dim]
    ffn_norm: torch.Tensor       # [d_model]
    gate_up: Linear              # [2 * d_ff, d_model]
    down: Linear                 # [d_model, d_ff]


@dataclass
class ModelWeights:
    embed: torch.Tensor          # [vocab, d_model]
    layers: list[LayerWeights]
    out_norm: torch.Tensor       # [d_model]
    output: Linear               # [vocab, d_model] (dense part shares the embedding when tied)
    rope_freqs: torch.Tensor | None  # [rope_dim / 2] llama3-style frequency divisors


def load_weights(f: GGUFFile, spec: ModelSpec, dtype: torch.dtype,
                 progress: Progress | None = None, fmt: WeightFormat = WeightFormat()) -> ModelWeights:
    total = spec.n_layers + 2
    tick = progress or (lambda done, total: None)
    d = spec.d_model
    embed = _load(f, "token_embd.weight", (spec.vocab_size, d), dtype)
    tick(1, total)
    layers = []
    for i in range(spec.n_layers):
        layers.append(_load_layer(f, spec, i, dtype, fmt))
        tick(i + 2, total)
    out_norm = _load(f, "output_norm.weight", (d,), torch.float32)
    out_name = "token_embd.weight" if spec.tied_embeddings else "output.weight"
    out_w = embed if spec.tied_embeddings else _load(f, out_name, (spec.vocab_size, d), dtype)
    output = Linear.build(out_w, None, _kind(f, out_name, fmt), fmt.output_max_rows)
    freqs = _load(f, "rope_freqs.weight", (spec.rope_dim // 2,), torch.float32) if spec.has_rope_freqs else None
    tick(total, total)
    return ModelWeights(embed, layers, out_norm, output, freqs)


def _load_layer(f: GGUFFile, spec: ModelSpec, i: int, dtype: torch.dtype, fmt: WeightFormat) -> LayerWeights:
    d, hd, p = spec.d_model, spec.head_dim, f"blk.{i}."
    q = _load(f, p + "attn_q.weight", (spec.n_heads * hd, d), dtype)
    k = _load(f, p + "attn_k.weight", (spec.n_kv_heads * hd, d), dtype)
    v = _load(f, p + "attn_v.weight", (spec.n_kv_heads * hd, d), dtype)
    bias = None
    if spec.qkv_bias:
        bq = _load(f, p + "attn_q.bias", (spec.n_heads * hd,), dtype)
        bk = _load(f, p + "attn_k.bias", (spec.n_kv_heads * hd,), dtype)
        bv = _load(f, p + "attn_v.bias", (spec.n_kv_heads * hd,), dtype)
        if spec.rope_mode == "neox":
            bq, bk = _neox_to_normal(bq, spec), _neox_to_normal(bk, spec)
        bias = torch.cat([bq, bk, bv])
    if spec.rope_mode == "neox":
        q, k = _neox_to_normal(q, spec), _neox_to_normal(k, spec)
    gate = _load(f, p + "ffn_gate.weight", (spec.d_ff, d), dtype)
    up = _load(f, p + "ffn_up.weight", (spec.d_ff, d), dtype)
    def lin(names: list[str], w: torch.Tensor, b: torch.Tensor | None = None) -> Linear:
        kinds = {_kind(f, p + n + ".weight", fmt) for n in names}
        return Linear.build(w, b, kinds.pop() if len(kinds) == 1 else _no_int4(fmt.kind), fmt.int8_max_rows,
                            fmt.native_max_rows)

    return LayerWeights(
        attn_norm=_load(f, p + "attn_norm.weight", (d,), torch.float32),
        qkv=lin(["attn_q", "attn_k", "attn_v"], torch.cat([q, k, v]), bias),
        wo=lin(["attn_output"], _load(f, p + "attn_output.weight", (d, spec.n_heads * hd), dtype)),
        ffn_norm=_load(f, p + "ffn_norm.weight", (d,), torch.float32),
        gate_up=lin(["ffn_gate", "ffn_up"], torch.cat([gate, up])),
        down=lin(["ffn_down"], _load(f, p + "ffn_down.weight", (d, spec.d_ff), dtype)),
    )


def _no_int4(kind: str) -> str:
    return {"int4": "int8", "auto4": "auto"}.get(kind, kind)


def _kind(f: GGUFFile, name: str, fmt: WeightFormat) -> str:
    """int4 only where it re-encodes the file's weights exactly (Q4_1); int8 elsewhere.

    Re-quantizing a Q8_0 or Q6_K tensor (e.g. SmolLM2's tied embedding/output) to 4 bits loses
    enough to drop greedy agreement with float32 from ~98% to ~86%.
    """
    if fmt.kind in ("int4", "auto4") and f.tensors[name].ggml_type != gguf.GGMLQuantizationType.Q4_1:
        return _no_int4(fmt.kind)
    return fmt.kind


def _load(f: GGUFFile, name: str, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    f.require(name, shape)
    return f.load_tensor(name, dtype)


def _neox_to_normal(w: torch.Tensor, spec: ModelSpec) -> torch.Tensor:
    """Reorder each head's rows from half-split rope pairs (i, i+r/2) to adjacent pairs (2i, 2i+1).

    Attention scores only depend on q.k, which is invariant under one permutation of the head dim
    applied to both q and k; so a neox-rope model runs with the normal-mode rope kernel.
    """
    hd, half = spec.head_dim, spec.rope_dim // 2
    order = [j for i in range(half) for j in (i, i + half)] + list(range(spec.rope_dim, hd))
    heads = w.shape[0] // hd
    return w.view(heads, hd, *w.shape[1:])[:, order].reshape(w.shape)
