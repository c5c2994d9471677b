"""One layer's weights dequantized at load (`--weights dense`, `auto` under float32, and the int8 /
int4 formats): `Linear`s of the compute dtype, one tensor at a time (never two full copies).

q/k/v are fused into one `[q+2kv, d_model]` matrix (qwen35's output gates after v) and gate/up into
one `[2*d_ff, d_model]` matrix; a neox-rope model's q and k rows (and biases) are reordered to
adjacent pairs (weights.py's `_neox_to_normal`). The hybrids' recurrent layers load in
recurrent_layer.py (their FFN with this file's `dense_ffn` and `linear_builder`), nemotron_h's
FFN-only ones in ffn_layer.py.
"""

from __future__ import annotations

from typing import Callable

import torch

from slotserver.model.gguf_file import GGUFFile
from slotserver.model.linear import Linear
from slotserver.model.moe_weights import load_moe
from slotserver.model.spec import ModelSpec
from slotserver.model.weights import (LayerWeights, WeightFormat, _kind, _load, _neox_to_normal, _no_int4, _norms,
                                      _out_bias, _pre_norm, _sinks, gated_q_rows)


def dense_layer(f: GGUFFile, spec: ModelSpec, i: int, dtype: torch.dtype, fmt: WeightFormat,
                q4_kernel=None) -> LayerWeights:
    d, hd, p = spec.d_model, spec.head_dim, f"blk.{i}."
    q_rows, kv_rows = spec.n_heads * hd, spec.n_kv_heads * hd
    if p + "attn_qkv.weight" in f.tensors:   # phi3: q|k|v already one tensor
        q, k, v = _load(f, p + "attn_qkv.weight", (q_rows + 2 * kv_rows, d), dtype).split([q_rows, kv_rows, kv_rows])
        qkv_names = ("attn_qkv",)
    else:
        q = _load(f, p + "attn_q.weight", (2 * q_rows if spec.attn_gate else q_rows, d), dtype)
        k = _load(f, p + "attn_k.weight", (kv_rows, d), dtype)
        v = _load(f, p + "attn_v.weight", (kv_rows, d), dtype)
        qkv_names = ("attn_q", "attn_k", "attn_v")
    bias = None
    if spec.qkv_bias:
        bq = _load(f, p + "attn_q.bias", (spec.n_heads * hd,), dtype)
        bk = _load(f, p + "attn_k.bias", (spec.n_kv_heads * hd,), dtype)
        bv = _load(f, p + "attn_v.bias", (spec.n_kv_heads * hd,), dtype)
        if spec.rope_mode == "neox":
            bq, bk = _neox_to_normal(bq, spec), _neox_to_normal(bk, spec)
        bias = torch.cat([bq, bk, bv])
    gate = None
    if spec.attn_gate:   # qwen35: per head [q | gate] rows -> q, gate (appended after v)
        q, gate = (q[rows] for rows in gated_q_rows(spec))
    if spec.rope_mode == "neox":
        q, k = _neox_to_normal(q, spec), _neox_to_normal(k, spec)
    lin = linear_builder(f, p, fmt, q4_kernel)
    gate_up, down = dense_ffn(f, spec, p, dtype, lin)

    return LayerWeights(
        attn_norm=_pre_norm(f, spec, p + "attn_norm.weight"),
        qkv=lin(qkv_names, torch.cat([q, k, v] + ([gate] if gate is not None else [])), bias),
        wo=lin(("attn_output",), _load(f, p + "attn_output.weight", (d, spec.n_heads * hd), dtype),
               None if not spec.out_bias else _out_bias(f, spec, p).to(dtype)),
        ffn_norm=_pre_norm(f, spec, p + spec.ffn_norm + ".weight"),
        gate_up=gate_up,
        down=down,
        **_norms(f, spec, p),
        moe=load_moe(f, spec, p, fmt.kind, dtype) if spec.moe else None,
        sinks=_sinks(f, spec, p),
    )


def linear_builder(f: GGUFFile, p: str, fmt: WeightFormat, q4_kernel=None) -> Callable[..., Linear]:
    """`lin(names, w, bias=None)`: layer `p`'s file tensors `names`, loaded and stacked as `w`, as one
    `Linear` of `fmt`: int4 only where every part is Q4_1 (weights.py's `_kind`)."""
    def lin(names: tuple[str, ...], w: torch.Tensor, b: torch.Tensor | None = None) -> Linear:
        kinds = {_kind(f, p + n + ".weight", fmt) for n in names}
        return Linear.build(w, b, kinds.pop() if len(kinds) == 1 else _no_int4(fmt.kind), fmt.int8_max_rows,
                            fmt.native_max_rows, q4_kernel)
    return lin


def dense_ffn(f: GGUFFile, spec: ModelSpec, p: str, dtype: torch.dtype,
              lin: Callable[..., Linear]) -> tuple[Linear | None, Linear | None]:
    """(gate|up, down) dequantized: the dense FFN, a MoE layer's shared expert, or (None, None) for a
    MoE layer without one or a layer with no FFN."""
    d = spec.d_model
    ff, sfx = (spec.moe.d_ff_shared, "_shexp") if spec.moe else (spec.d_ff, "")
    if not ff:
        return None, None
    if spec.fused:   # phi3: ffn_up holds gate|up
        gate_up = lin(("ffn_up",), _load(f, p + "ffn_up.weight", (2 * ff, d), dtype))
    else:   # arcee's squared ReLU: up alone, no gate
        names = ("ffn_up" + sfx,) if spec.act == "relu2" else ("ffn_gate" + sfx, "ffn_up" + sfx)
        gate_up = lin(names, torch.cat([_load(f, p + n + ".weight", (ff, d), dtype) for n in names]))
    return gate_up, lin(("ffn_down" + sfx,), _load(f, p + "ffn_down" + sfx + ".weight", (d, ff), dtype))
