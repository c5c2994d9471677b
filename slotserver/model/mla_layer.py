"""One latent-attention layer's weights (deepseek2: mla_spec.py), as GGUF blocks or dequantized.

The matmuls that take the normed rows are one: q's (attn_q_a, the low-rank bottleneck, or attn_q)
stacked over attn_kv_a_mqa's (the latent, then the shared rope key), so the layer's input projection
is one fused call like any layer's q|k|v (`LayerWeights.qkv`); attn_q_b (after q_a's RMSNorm) and
attn_output are matmuls of the format asked. The per-head absorption matrices W_kb and W_vb
(`MlaWeights`) are small ([heads, rank, nope] and [heads, v_dim, rank]) and multiply [heads] batches
of rows, not the rows of a batch: they load dequantized to float32, whatever the file's format.
A legacy file's attn_kv_b is split into them here (mla_spec.py). The FFN, dense or experts, loads as
any layer's (dense_layer.py, block_layer.py, moe_weights.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from slotserver.model.block_layer import block_ffn, blocks, qlinear
from slotserver.model.dense_layer import dense_ffn, linear_builder
from slotserver.model.gguf_file import GGUFFile
from slotserver.model.linear import Linear, QLinear
from slotserver.model.moe_weights import load_moe
from slotserver.model.spec import ModelSpec
from slotserver.model.weights import LayerWeights, WeightFormat, _load, _pre_norm


@dataclass
class MlaWeights:
    k_b: torch.Tensor                        # [heads, kv_lora_rank, nope] float32: q_nope -> the latent's space
    v_b: torch.Tensor                        # [heads, v_dim, kv_lora_rank] float32: the attended latent -> values
    kv_a_norm: torch.Tensor                  # [kv_lora_rank] float32: the latent's RMSNorm
    q_b: Linear | QLinear | None = None      # [heads * (nope + rope), q_lora_rank]; None: q straight from attn_q
    q_a_norm: torch.Tensor | None = None     # [q_lora_rank] float32


def mla_layer(f: GGUFFile, spec: ModelSpec, i: int, kind: str, dtype: torch.dtype, fmt: WeightFormat,
              q4_kernel=None) -> LayerWeights:
    """Layer i's weights; kind: the resolved weight kind ("q": GGUF blocks, else dequantized)."""
    d, m, h, p = spec.d_model, spec.mla, spec.n_heads, f"blk.{i}."
    q_name = "attn_q_a" if m.q_lora_rank else "attn_q"
    shapes = {q_name: (m.q_width(h), d), "attn_kv_a_mqa": (m.row, d), "attn_q_b": (h * m.qk_dim, m.q_lora_rank),
              "attn_output": (d, h * m.v_dim)}
    if kind == "q":
        def one(name: str):
            return qlinear(f, [blocks(f, p + name + ".weight", shapes[name])], [None], False)
        names = (q_name, "attn_kv_a_mqa")
        qkv = qlinear(f, [blocks(f, p + n + ".weight", shapes[n]) for n in names],
                      [f.tensors[p + n + ".weight"] for n in names], fmt.fuse_copy)
        gate_up, down = block_ffn(f, spec, p, fmt)
        moe = load_moe(f, spec, p, "q", torch.float32) if spec.moe else None
    else:
        lin = linear_builder(f, p, fmt, q4_kernel)

        def one(name: str):
            return lin((name,), _load(f, p + name + ".weight", shapes[name], dtype))
        qkv = lin((q_name, "attn_kv_a_mqa"), torch.cat([_load(f, p + n + ".weight", shapes[n], dtype)
                                                        for n in (q_name, "attn_kv_a_mqa")]))
        gate_up, down = dense_ffn(f, spec, p, dtype, lin)
        moe = load_moe(f, spec, p, fmt.kind, dtype) if spec.moe else None
    k_b, v_b = _absorbed(f, spec, p)
    norm = (lambda n, r: _load(f, p + n, (r,), torch.float32))   # noqa: E731
    mla = MlaWeights(k_b, v_b, norm("attn_kv_a_norm.weight", m.kv_lora_rank),
                     one("attn_q_b") if m.q_lora_rank else None,
                     norm("attn_q_a_norm.weight", m.q_lora_rank) if m.q_lora_rank else None)
    return LayerWeights(attn_norm=_pre_norm(f, spec, p + "attn_norm.weight"), qkv=qkv, wo=one("attn_output"),
                        ffn_norm=_pre_norm(f, spec, p + spec.ffn_norm + ".weight"), gate_up=gate_up, down=down,
                        moe=moe, mla=mla)


def _absorbed(f: GGUFFile, spec: ModelSpec, p: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(W_kb [heads, rank, nope], W_vb [heads, v_dim, rank]) float32: the file's attn_k_b / attn_v_b, or
    a legacy file's attn_kv_b ([heads * (nope + v_dim), rank]: per head its nope rows, then its v rows)."""
    m, h = spec.mla, spec.n_heads
    if not m.legacy:
        return (_load(f, p + "attn_k_b.weight", (h, m.kv_lora_rank, m.nope), torch.float32),
                _load(f, p + "attn_v_b.weight", (h, m.v_dim, m.kv_lora_rank), torch.float32))
    kv_b = _load(f, p + "attn_kv_b.weight", (h * (m.nope + m.v_dim), m.kv_lora_rank), torch.float32)
    kv_b = kv_b.view(h, m.nope + m.v_dim, m.kv_lora_rank)
    return kv_b[:, : m.nope].transpose(1, 2).contiguous(), kv_b[:, m.nope:].contiguous()
