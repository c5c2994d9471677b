"""One latent-attention layer's weights (deepseek2: mla_spec.py), as GGUF blocks or dequantized.

The matmuls that take the normed rows are one: q's (attn_q_a, the low-rank bottleneck, or attn_q)
stacked over attn_kv_a_mqa's (the latent, then the shared rope key), so the layer's input projection
is one fused call like any layer's q|k|v (`LayerWeights.qkv`); attn_q_b (after q_a's RMSNorm) and
attn_output are matmuls of the format asked. The per-head absorption matrices W_kb and W_vb
(`MlaWeights`: [heads, rank, nope] and [heads, v_dim, rank]) multiply each head's row by its own
matrix: as the file's blocks they load as `Experts`, one a head, for the moe_matmul kernel's
per-slot products (every token's slots the heads; an 8-bit-activation integer GEMM, as llama.cpp
multiplies them), otherwise (dequantized weights, float tensors, a legacy file's attn_kv_b, split
here) as float32 tensors for torch's batched product (exact). Why blocks: GLM-4.7-Flash's 20
heads of 512 x 192 and 256 x 512 are 18.4 MB a layer in float32, 2.8 MB in its file's Q5_0 / Q4_K;
a decode step of a 6-layer model of its shapes took 30.1 ms with them in float32, 26.2 ms on the
blocks (2 cores, AVX2, b=1, in-process). The FFN, dense or experts, loads as
any layer's (dense_layer.py, block_layer.py, moe_weights.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import gguf
import torch

from slotserver.model.block_layer import block_ffn, blocks, qlinear
from slotserver.model.dense_layer import dense_ffn, linear_builder
from slotserver.model.gguf_file import GGUFFile
from slotserver.model.linear import Linear, QLinear
from slotserver.model.moe_weights import expert_rows, load_moe
from slotserver.model.spec import ModelSpec
from slotserver.model.step_graph import MAX_ROWS
from slotserver.model.weights import LayerWeights, WeightFormat, _load, _pre_norm
from slotserver.runtime.experts import Experts


T = gguf.GGMLQuantizationType
# the formats of attn_k_b / attn_v_b that moe_matmul multiplies in C (its repacked integer GEMM):
# what llama-quantize writes for them (rows of 128-512: Q8_0, Q5_0/Q4_0 where K-quants do not fit)
BLOCKS = {T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.Q4_K, T.Q5_K, T.Q6_K}


@dataclass
class MlaWeights:
    # [heads, kv_lora_rank, nope]: q_nope -> the latent's space; [heads, v_dim, kv_lora_rank]: the attended
    # latent -> values. Experts (one a head) of the file's blocks, or float32 tensors (`_absorbed`)
    k_b: Experts | torch.Tensor
    v_b: Experts | torch.Tensor
    kv_a_norm: torch.Tensor                  # [kv_lora_rank] float32: the latent's RMSNorm
    q_b: Linear | QLinear | None = None      # [heads * (nope + rope), q_lora_rank]; None: q straight from attn_q
    q_a_norm: torch.Tensor | None = None     # [q_lora_rank] float32
    # moe_matmul's ids for the per-head products of up to MAX_ROWS tokens (every token's slots: heads
    # 0..H-1), built at load: a step slices them (a view), so a decode step computes nothing in torch
    heads: torch.Tensor = field(default_factory=lambda: torch.empty(0, 0, dtype=torch.int64))


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
    k_b, v_b = _absorbed(f, spec, p, kind)
    norm = (lambda n, r: _load(f, p + n, (r,), torch.float32))   # noqa: E731
    mla = MlaWeights(k_b, v_b, norm("attn_kv_a_norm.weight", m.kv_lora_rank),
                     one("attn_q_b") if m.q_lora_rank else None,
                     norm("attn_q_a_norm.weight", m.q_lora_rank) if m.q_lora_rank else None,
                     torch.arange(h).expand(MAX_ROWS, h).contiguous())
    return LayerWeights(attn_norm=_pre_norm(f, spec, p + "attn_norm.weight"), qkv=qkv, wo=one("attn_output"),
                        ffn_norm=_pre_norm(f, spec, p + spec.ffn_norm + ".weight"), gate_up=gate_up, down=down,
                        moe=moe, mla=mla)


def _absorbed(f: GGUFFile, spec: ModelSpec, p: str, kind: str) -> tuple[Experts | torch.Tensor, ...]:
    """(W_kb [heads, rank, nope], W_vb [heads, v_dim, rank]): the file's attn_k_b / attn_v_b as one
    "expert" a head for moe_matmul's per-slot products where they are blocks it repacks (`BLOCKS`,
    kind q), else float32 tensors for torch's batched product (moe_matmul's float and other forms
    loop over its experts in torch: 10-20x slower at 16-128 heads). A legacy file's attn_kv_b
    ([heads * (nope + v_dim), rank]: per head its nope rows, then its v rows) is split, float32."""
    m, h = spec.mla, spec.n_heads
    if m.legacy:
        kv_b = _load(f, p + "attn_kv_b.weight", (h * (m.nope + m.v_dim), m.kv_lora_rank), torch.float32)
        kv_b = kv_b.view(h, m.nope + m.v_dim, m.kv_lora_rank)
        return kv_b[:, : m.nope].transpose(1, 2).contiguous(), kv_b[:, m.nope:].contiguous()
    return tuple(_per_head(f, p + name, shape, kind) for name, shape in (
        ("attn_k_b.weight", (h, m.kv_lora_rank, m.nope)), ("attn_v_b.weight", (h, m.v_dim, m.kv_lora_rank))))


def _per_head(f: GGUFFile, name: str, shape: tuple[int, int, int], kind: str) -> Experts | torch.Tensor:
    if kind == "q" and f.require(name, shape).ggml_type in BLOCKS:
        return Experts((expert_rows(f, name, shape, "q", torch.float32),), shape[0])
    return _load(f, name, shape, torch.float32)
