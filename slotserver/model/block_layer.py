"""One layer's weights as the file's GGUF blocks (`--weights q`, and `auto` below float32): views of
the file's mapping computed on by kernels/qmatmul.py (`QLinear`), nothing read at load.

Fused matmuls: gate|up (adjacent in llama.cpp-written files) is one view; q|k|v is not adjacent there
(the file's order is k, output, q, v), so it is copied once into one block tensor (~1/6 of the
layer bytes) where the three share a format (`WeightFormat.fuse_copy`). A neox-rope model's q and k
rows are reordered (a copy of those two: weights.py's `_neox_rows`). A format qmatmul lacks loads
dense float32. The hybrids' recurrent layers (recurrent_layer.py) and nemotron_h's FFN-only ones
(ffn_layer.py) build on `blocks`, `qlinear` and `block_ffn`.
"""

from __future__ import annotations

import torch

from slotserver.model.gguf_file import GGUFFile, TensorInfo
from slotserver.model.linear import Linear, QLinear
from slotserver.model.moe_weights import load_moe
from slotserver.model.spec import ModelSpec
from slotserver.model.weights import (LayerWeights, WeightFormat, _load, _neox_rows, _neox_to_normal, _norms,
                                      _out_bias, _pre_norm, _qkv_rows, _sinks, gated_q_rows)
from slotserver.runtime.qblocks import FLOATS, QUANTIZED, QWeight, concat_rows, from_mapped, get_rows, take_rows

SERVED = {int(t) for t in QUANTIZED + tuple(FLOATS)}   # the formats kernels/qmatmul.py computes on


def block_layer(f: GGUFFile, spec: ModelSpec, i: int, fmt: WeightFormat) -> LayerWeights:
    """One layer's matmuls as GGUF blocks (q/k rows reordered for neox rope: a copy of those two)."""
    d, hd, p = spec.d_model, spec.head_dim, f"blk.{i}."
    q_rows, kv_rows = spec.n_heads * hd, spec.n_kv_heads * hd
    if p + "attn_qkv.weight" in f.tensors:   # phi3: q|k|v already one tensor
        qkv_w = blocks(f, p + "attn_qkv.weight", (q_rows + 2 * kv_rows, d))
        qkv = qlinear(f, [take_rows(qkv_w, _qkv_rows(spec)) if spec.rope_mode == "neox" else qkv_w], [None], False)
    else:
        qkv = _block_qkv(f, spec, p, fmt)
    gate_up, down = block_ffn(f, spec, p, fmt)
    return LayerWeights(
        attn_norm=_pre_norm(f, spec, p + "attn_norm.weight"),
        qkv=qkv,
        wo=qlinear(f, [blocks(f, p + "attn_output.weight", (d, q_rows))], [None], False, _out_bias(f, spec, p)),
        ffn_norm=_pre_norm(f, spec, p + spec.ffn_norm + ".weight"),
        gate_up=gate_up,
        down=down,
        **_norms(f, spec, p),
        moe=load_moe(f, spec, p, "q", torch.float32) if spec.moe else None,
        sinks=_sinks(f, spec, p),
    )


def block_ffn(f: GGUFFile, spec: ModelSpec, p: str, fmt: WeightFormat) -> tuple[QLinear | None, QLinear | None]:
    """(gate|up, down) as GGUF blocks: the dense FFN, a MoE layer's shared expert, or (None, None)."""
    d, ff, sfx = spec.d_model, spec.d_ff, ""
    if not ff and not spec.moe:   # a mixer alone (nemotron_h)
        return None, None
    if spec.moe:
        if not spec.moe.d_ff_shared:
            return None, None
        ff, sfx = spec.moe.d_ff_shared, "_shexp"
    if spec.fused:   # phi3: ffn_up holds gate|up
        gate_up = qlinear(f, [blocks(f, p + "ffn_up.weight", (2 * ff, d))], [None], False)
    else:   # arcee's squared ReLU: up alone, no gate
        names = ("ffn_up" + sfx,) if spec.act == "relu2" else ("ffn_gate" + sfx, "ffn_up" + sfx)
        gate_up = qlinear(f, [blocks(f, p + n + ".weight", (ff, d)) for n in names],
                           [f.tensors[p + n + ".weight"] for n in names], fmt.fuse_copy)
    return gate_up, qlinear(f, [blocks(f, p + "ffn_down" + sfx + ".weight", (d, ff))], [None], False)


def _block_qkv(f: GGUFFile, spec: ModelSpec, p: str, fmt: WeightFormat) -> QLinear:
    """Separate q, k, v tensors as one QLinear (q/k rows reordered for neox rope: a copy of those two)."""
    d, hd = spec.d_model, spec.head_dim
    q_rows, kv_rows = spec.n_heads * hd, spec.n_kv_heads * hd
    gate = None
    if spec.attn_gate:   # qwen35: each head's q rows then its output gate's; the gates go last
        both = blocks(f, p + "attn_q.weight", (2 * q_rows, d))
        q, gate = (take_rows(both, rows) for rows in gated_q_rows(spec))
    else:
        q = blocks(f, p + "attn_q.weight", (q_rows, d))
    k = blocks(f, p + "attn_k.weight", (kv_rows, d))
    v = blocks(f, p + "attn_v.weight", (kv_rows, d))
    infos = [None if gate is not None else f.tensors[p + "attn_q.weight"]]
    infos += [f.tensors[p + n + ".weight"] for n in ("attn_k", "attn_v")]
    bias = None
    if spec.qkv_bias:
        bq, bk, bv = (_load(f, p + n, (r,), torch.float32)
                      for n, r in (("attn_q.bias", q_rows), ("attn_k.bias", kv_rows), ("attn_v.bias", kv_rows)))
        if spec.rope_mode == "neox":
            bq, bk = _neox_to_normal(bq, spec), _neox_to_normal(bk, spec)
        bias = torch.cat([bq, bk, bv])
    if spec.rope_mode == "neox":
        q, k = take_rows(q, _neox_rows(spec, q.n)), take_rows(k, _neox_rows(spec, k.n))
        infos[:2] = [None, None]   # no longer the file's bytes
    parts = [q, k, v] + ([gate] if gate is not None else [])
    return qlinear(f, parts, infos + [None] * (len(parts) - 3), fmt.fuse_copy, bias)


def blocks(f: GGUFFile, name: str, shape: tuple[int, int]) -> QWeight:
    """A tensor's GGUF blocks, viewed in the file's mapping (no copy, nothing read yet)."""
    info = f.require(name, shape)
    return from_mapped(f.tensor_bytes(info), info.ggml_type, shape)


def qlinear(f: GGUFFile, parts: list[QWeight], infos: list[TensorInfo | None], copy: bool,
             bias: torch.Tensor | None = None):
    """Parts stacked along `out`: runs of one format become one QWeight (a view of the file where
    their bytes are adjacent there, else a copy if `copy`); a format qmatmul lacks: dense float32."""
    if any(int(w.qtype) not in SERVED for w in parts):
        dense = torch.cat([get_rows(w, torch.arange(w.n)) for w in parts])
        return Linear.build(dense, bias, "dense", 0)
    runs: list[list[int]] = []
    for j, w in enumerate(parts):
        if runs and parts[runs[-1][-1]].qtype == w.qtype:
            runs[-1].append(j)
        else:
            runs.append([j])
    out = []
    for run in runs:
        ws, fi = [parts[j] for j in run], [infos[j] for j in run]
        joined = f.joined_bytes(fi) if len(ws) > 1 and all(fi) else None
        if joined is not None:
            out.append(from_mapped(joined, ws[0].qtype, (sum(w.n for w in ws), ws[0].k)))
        elif len(ws) > 1 and copy:
            out.append(concat_rows(ws))
        else:
            out.extend(ws)
    return QLinear(out, bias)
