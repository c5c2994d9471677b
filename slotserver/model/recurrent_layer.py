"""A hybrid model's recurrent layer weights: Qwen3.5's gated delta net (llama.cpp's qwen35 tensors),
LFM2's short convolution (lfm2's) and Granite 4.0-H's Mamba-2 layer (granitehybrid's).

The layer is a `LayerWeights` like any other, so that the loop of model.py runs it: `qkv` is the
fused in-projection and `wo` the out-projection, both plain matmuls in any weight format; what only
the recurrence reads is `recurrent` (GdnParams, model/delta_net.py; ShortConvParams,
model/short_conv.py), whose `run` computes the layer between the two matmuls. The in-projections,
stacked along their output rows (one matmul, as q|k|v is one for attention):

    gdn        attn_qkv [conv_dim, d_model]   q | k | v, convolved (conv_dim = 2 key_dim + value_dim)
               attn_gate [value_dim, d_model] z, the output gate
               ssm_beta [v_heads, d_model]    the delta rule's write strength (sigmoid)
               ssm_alpha [v_heads, d_model]   the decay's input (softplus(alpha + dt_bias) * a)
    shortconv  shortconv.in_proj [3 d_model, d_model]   B | C | x
    mamba2     ssm_in [2 inner + 2 groups N + heads, d_model]   z | x B C | dt

For Qwen3.5 the converter has already put V heads in tiled order and written `ssm_a` as -exp(A_log).
"""

from __future__ import annotations

import torch

from slotserver.model.delta_net import GdnParams
from slotserver.model.dense_layer import dense_ffn, linear_builder
from slotserver.model.gguf_file import GGUFFile
from slotserver.model.mamba2 import Mamba2Params
from slotserver.model.moe_weights import load_moe
from slotserver.model.short_conv import ShortConvParams
from slotserver.model.spec import ModelSpec
from slotserver.model.block_layer import block_ffn, blocks, qlinear
from slotserver.model.weights import LayerWeights, WeightFormat, _load, _pre_norm


def recurrent_layer(f: GGUFFile, spec: ModelSpec, i: int, kind: str, dtype: torch.dtype, fmt: WeightFormat,
                    q4_kernel=None) -> LayerWeights:
    """Layer i of a hybrid model, a recurrent one: kind "q" keeps GGUF blocks, else `Linear`'s formats."""
    r, d, p = spec.recurrent, spec.d_model, f"blk.{i}."
    if r.kind == "shortconv":
        ins, out = [("shortconv.in_proj", 3 * d)], ("shortconv.out_proj", d)
    elif r.kind == "mamba2":
        ins, out = [("ssm_in", r.proj_dim)], ("ssm_out", r.value_dim)
    else:
        ins = [("attn_qkv", r.conv_dim), ("attn_gate", r.value_dim), ("ssm_beta", r.n_v_heads),
               ("ssm_alpha", r.n_v_heads)]
        out = ("ssm_out", r.value_dim)
    if kind == "q":
        parts = [blocks(f, p + n + ".weight", (rows, d)) for n, rows in ins]
        in_proj = qlinear(f, parts, [f.tensors[p + n + ".weight"] for n, _ in ins], fmt.fuse_copy)
        out_proj = qlinear(f, [blocks(f, p + out[0] + ".weight", (d, out[1]))], [None], False)
        gate_up, down = block_ffn(f, spec, p, fmt)
    else:
        lin = linear_builder(f, p, fmt, q4_kernel)
        in_proj = lin(tuple(n for n, _ in ins), torch.cat([_load(f, p + n + ".weight", (rows, d), dtype) for n, rows in ins]))
        out_proj = lin((out[0],), _load(f, p + out[0] + ".weight", (d, out[1]), dtype))
        gate_up, down = dense_ffn(f, spec, p, dtype, lin)
    return LayerWeights(attn_norm=_load(f, p + "attn_norm.weight", (d,), torch.float32), qkv=in_proj, wo=out_proj,
                        ffn_norm=(_pre_norm(f, spec, p + spec.ffn_norm + ".weight")   # none without an FFN
                                  if gate_up is not None or spec.moe else None),
                        gate_up=gate_up, down=down, recurrent=_params(f, spec, p),
                        moe=load_moe(f, spec, p, kind, dtype) if spec.moe else None)


def _params(f: GGUFFile, spec: ModelSpec, p: str) -> GdnParams | ShortConvParams | Mamba2Params:
    r = spec.recurrent
    if r.kind == "shortconv":
        return ShortConvParams(_load(f, p + "shortconv.conv.weight", (r.conv_dim, r.d_conv), torch.float32).contiguous())
    if r.kind == "mamba2":
        return _mamba2_params(f, r, p, optional_norm=spec.parallel_mixers)
    return GdnParams(
        conv=_load(f, p + "ssm_conv1d.weight", (r.conv_dim, r.d_conv), torch.float32).contiguous(),
        dt_bias=_load(f, p + "ssm_dt.bias", (r.n_v_heads,), torch.float32),
        a=_load(f, p + "ssm_a", (r.n_v_heads,), torch.float32),
        norm=_load(f, p + "ssm_norm.weight", (r.head_v,), torch.float32))


def _mamba2_params(f: GGUFFile, r, p: str, optional_norm: bool = False) -> Mamba2Params:
    """A Mamba-2 layer's small tensors (numpy order): ssm_a and ssm_d [heads, 1], ssm_norm [groups,
    inner / groups], or each flat (a one-group ssm_norm, as llama-quantize writes it); the
    convolution's bias may be absent (zeros)."""
    heads, inner, groups = r.n_v_heads, r.value_dim, r.n_k_heads

    def vector(name: str, shape: tuple[int, ...]) -> torch.Tensor:   # `shape`, or its size flat
        flat, info = (shape[0] * shape[1],), f.tensors.get(p + name)
        return _load(f, p + name, flat if info is not None and info.shape == flat else shape, torch.float32).reshape(-1)

    bias = p + "ssm_conv1d.bias"
    return Mamba2Params(
        conv=_load(f, p + "ssm_conv1d.weight", (r.conv_dim, r.d_conv), torch.float32).contiguous(),
        conv_bias=(_load(f, bias, (r.conv_dim,), torch.float32).contiguous() if bias in f.tensors
                   else torch.zeros(r.conv_dim)),
        dt_bias=_load(f, p + "ssm_dt.bias", (heads,), torch.float32).contiguous(),
        a=vector("ssm_a", (heads, 1)).contiguous(), d=vector("ssm_d", (heads, 1)).contiguous(),
        norm=(None if optional_norm and p + "ssm_norm.weight" not in f.tensors   # falcon-h1 without mamba_rms_norm:
              else vector("ssm_norm.weight", (groups, inner // groups)).contiguous()))   # no group norm, as llama.cpp
