"""A hybrid model's gated delta-net layer weights (Qwen3.5, llama.cpp's qwen35 tensors).

The layer is a `LayerWeights` like any other, so that the loop of model.py runs it: `qkv` is the
fused in-projection and `wo` the out-projection (`ssm_out`), both plain matmuls in any weight
format; what only the delta net reads is `GdnParams`. The in-projection stacks, along its output
rows (one matmul instead of four, as q|k|v is one for attention):

    attn_qkv  [conv_dim, d_model]    q | k | v, convolved (conv_dim = 2 key_dim + value_dim)
    attn_gate [value_dim, d_model]   z, the output gate
    ssm_beta  [v_heads, d_model]     the delta rule's write strength (sigmoid)
    ssm_alpha [v_heads, d_model]     the decay's input (softplus(alpha + dt_bias) * a)

The converter has already put V heads in tiled order and written `ssm_a` as -exp(A_log).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from slotserver.model.gguf_file import GGUFFile
from slotserver.model.linear import Linear
from slotserver.model.moe_weights import load_moe
from slotserver.model.spec import ModelSpec
from slotserver.model.weights import (LayerWeights, WeightFormat, _block_ffn, _blocks, _kind, _load, _no_int4,
                                      _qlinear)

IN_PROJ = ("attn_qkv", "attn_gate", "ssm_beta", "ssm_alpha")


@dataclass
class GdnParams:
    conv: torch.Tensor      # [conv_dim, d_conv] float32: the causal depthwise convolution's taps
    dt_bias: torch.Tensor   # [v_heads] float32
    a: torch.Tensor         # [v_heads] float32: -exp(A_log)
    norm: torch.Tensor      # [head_v] float32: RMSNorm weight of each head's output


def gdn_layer(f: GGUFFile, spec: ModelSpec, i: int, kind: str, dtype: torch.dtype, fmt: WeightFormat,
              q4_kernel=None) -> LayerWeights:
    """Layer i of a hybrid model, a delta-net layer: kind "q" keeps GGUF blocks, else `Linear`'s formats."""
    r, d, p = spec.recurrent, spec.d_model, f"blk.{i}."
    rows = (r.conv_dim, r.value_dim, r.n_v_heads, r.n_v_heads)
    if kind == "q":
        parts = [_blocks(f, p + n + ".weight", (n_rows, d)) for n, n_rows in zip(IN_PROJ, rows)]
        in_proj = _qlinear(f, parts, [f.tensors[p + n + ".weight"] for n in IN_PROJ], fmt.fuse_copy)
        out = _qlinear(f, [_blocks(f, p + "ssm_out.weight", (d, r.value_dim))], [None], False)
        gate_up, down = _block_ffn(f, spec, p, fmt)
    else:
        def lin(names: tuple[str, ...], w: torch.Tensor) -> Linear:
            kinds = {_kind(f, p + n + ".weight", fmt) for n in names}
            return Linear.build(w, None, kinds.pop() if len(kinds) == 1 else _no_int4(fmt.kind), fmt.int8_max_rows,
                                fmt.native_max_rows, q4_kernel)
        in_proj = lin(IN_PROJ, torch.cat([_load(f, p + n + ".weight", (n_rows, d), dtype)
                                          for n, n_rows in zip(IN_PROJ, rows)]))
        out = lin(("ssm_out",), _load(f, p + "ssm_out.weight", (d, r.value_dim), dtype))
        ff, sfx = (spec.moe.d_ff_shared, "_shexp") if spec.moe else (spec.d_ff, "")   # MoE: the shared expert
        ffn, gate_up, down = ("ffn_gate" + sfx, "ffn_up" + sfx), None, None
        if ff:
            gate_up = lin(ffn, torch.cat([_load(f, p + n + ".weight", (ff, d), dtype) for n in ffn]))
            down = lin(("ffn_down" + sfx,), _load(f, p + "ffn_down" + sfx + ".weight", (d, ff), dtype))
    params = GdnParams(
        conv=_load(f, p + "ssm_conv1d.weight", (r.conv_dim, r.d_conv), torch.float32).contiguous(),
        dt_bias=_load(f, p + "ssm_dt.bias", (r.n_v_heads,), torch.float32),
        a=_load(f, p + "ssm_a", (r.n_v_heads,), torch.float32),
        norm=_load(f, p + "ssm_norm.weight", (r.head_v,), torch.float32))
    return LayerWeights(attn_norm=_load(f, p + "attn_norm.weight", (d,), torch.float32), qkv=in_proj, wo=out,
                        ffn_norm=_load(f, p + spec.ffn_norm + ".weight", (d,), torch.float32),
                        gate_up=gate_up, down=down, gdn=params,
                        moe=load_moe(f, spec, p, kind, dtype) if spec.moe else None)
