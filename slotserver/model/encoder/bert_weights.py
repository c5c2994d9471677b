"""A BERT GGUF's tensors (llama.cpp's names and shapes, src/models/bert.cpp), dequantized to float32.

Per layer q|k|v are one `[3 d, d]` projection (one matmul instead of three: concatenated, or the
file's fused `attn_qkv` as nomic-bert ships it); optional biases (llama.cpp: TENSOR_NOT_REQUIRED)
are zeros when absent; token types are optional (llama.cpp adds row 0, "sentence A", to every
token). `matmul_weights(dtype)` gives the projection
weights in the dtype the matmuls run in (bfloat16 on request: see BertModel).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from slotserver.model.encoder.bert_spec import BertSpec
from slotserver.model.gguf_file import GGUFFile

@dataclass
class BertLayer:
    qkv: torch.Tensor       # [3 d, d]: q | k | v rows
    qkv_b: torch.Tensor     # [3 d]
    wo: torch.Tensor        # [d, d]
    wo_b: torch.Tensor
    attn_norm: tuple[torch.Tensor, torch.Tensor]   # (weight, bias) [d] each
    up: torch.Tensor        # [d_ff, d]
    up_b: torch.Tensor | None   # None: a gated FFN (nomic-bert), which llama.cpp runs without biases
    down: torch.Tensor      # [d, d_ff]
    down_b: torch.Tensor | None
    out_norm: tuple[torch.Tensor, torch.Tensor]
    gate: torch.Tensor | None = None   # [d_ff, d]: the SiLU gate of a gated FFN (nomic-bert)


@dataclass
class BertWeights:
    tok_embd: torch.Tensor                   # [vocab, d]
    pos_embd: torch.Tensor | None            # [ctx_train, d] (None: rotary positions, nomic-bert)
    type_row0: torch.Tensor                  # [d]: token type 0's row (zeros without token types)
    embd_norm: tuple[torch.Tensor, torch.Tensor]
    layers: list[BertLayer]
    cls: tuple[torch.Tensor, torch.Tensor | None] | None = None       # [d, d], [d]: dense + tanh
    cls_out: tuple[torch.Tensor, torch.Tensor | None] | None = None   # [n_cls_out, d], [n_cls_out]


def _bias(f: GGUFFile, name: str, n: int) -> torch.Tensor:
    """An optional bias (llama.cpp: TENSOR_NOT_REQUIRED) as zeros when absent."""
    if name not in f.tensors:
        return torch.zeros(n)
    f.require(name, (n,))
    return f.load_tensor(name)


def _tensor(f: GGUFFile, name: str, shape: tuple[int, ...]) -> torch.Tensor:
    f.require(name, shape)
    return f.load_tensor(name)


def _norm(f: GGUFFile, name: str, d: int) -> tuple[torch.Tensor, torch.Tensor]:
    return _tensor(f, f"{name}.weight", (d,)), _tensor(f, f"{name}.bias", (d,))


def _qkv(f: GGUFFile, p: str, d: int) -> tuple[torch.Tensor, torch.Tensor]:
    """q|k|v weight [3 d, d] and bias [3 d]: the fused tensor where the file has one (llama.cpp's
    create_tensor_qkv: its fused bias, else separate ones, else none), else the three."""
    if f"{p}attn_qkv.weight" in f.tensors:
        w = _tensor(f, f"{p}attn_qkv.weight", (3 * d, d))
        if f"{p}attn_qkv.bias" in f.tensors:
            return w, _tensor(f, f"{p}attn_qkv.bias", (3 * d,))
        return w, torch.cat([_bias(f, f"{p}attn_{n}.bias", d) for n in "qkv"])
    return (torch.cat([_tensor(f, f"{p}attn_{n}.weight", (d, d)) for n in "qkv"]),
            torch.cat([_bias(f, f"{p}attn_{n}.bias", d) for n in "qkv"]))


def _layer(f: GGUFFile, s: BertSpec, i: int) -> BertLayer:
    p, d = f"blk.{i}.", s.d_model
    qkv, qkv_b = _qkv(f, p, d)
    ffn_b = (None, None) if s.gated else \
        (_bias(f, f"{p}ffn_up.bias", s.d_ff), _bias(f, f"{p}ffn_down.bias", d))   # gated: llama.cpp adds none
    return BertLayer(qkv=qkv, qkv_b=qkv_b, wo=_tensor(f, f"{p}attn_output.weight", (d, d)),
                     wo_b=_bias(f, f"{p}attn_output.bias", d), attn_norm=_norm(f, f"{p}attn_output_norm", d),
                     up=_tensor(f, f"{p}ffn_up.weight", (s.d_ff, d)), up_b=ffn_b[0],
                     down=_tensor(f, f"{p}ffn_down.weight", (d, s.d_ff)), down_b=ffn_b[1],
                     out_norm=_norm(f, f"{p}layer_output_norm", d),
                     gate=_tensor(f, f"{p}ffn_gate.weight", (s.d_ff, d)) if s.gated else None)


def _head(f: GGUFFile, name: str, rows: int, d: int) -> tuple[torch.Tensor, torch.Tensor | None] | None:
    if f"{name}.weight" not in f.tensors:
        return None
    bias = _tensor(f, f"{name}.bias", (rows,)) if f"{name}.bias" in f.tensors else None
    return _tensor(f, f"{name}.weight", (rows, d)), bias


def load_bert_weights(f: GGUFFile, s: BertSpec) -> BertWeights:
    """Every tensor llama.cpp's bert reads, checked for shape, dequantized to float32."""
    d = s.d_model
    types = _tensor(f, "token_types.weight", (f.tensors["token_types.weight"].shape[0], d)) \
        if s.has_token_types else torch.zeros(1, d)
    return BertWeights(
        tok_embd=_tensor(f, "token_embd.weight", (s.vocab_size, d)),
        pos_embd=None if s.rope_base else _tensor(f, "position_embd.weight", (s.ctx_train, d)),
        type_row0=types[0].clone(),
        embd_norm=_norm(f, "token_embd_norm", d), layers=[_layer(f, s, i) for i in range(s.n_layers)],
        cls=_head(f, "cls", d, d), cls_out=_head(f, "cls.output", s.n_cls_out, d))



MATMULS = ("qkv", "wo", "up", "down", "gate")   # the BertLayer fields that are projection weights


def matmul_weights(layers: list[BertLayer], dtype: torch.dtype) -> list[BertLayer]:
    """The layers with their projection weights in `dtype` (biases and norms stay float32)."""
    if dtype == torch.float32:
        return layers
    return [replace(lw, **{n: getattr(lw, n).to(dtype) for n in MATMULS if getattr(lw, n) is not None})
            for lw in layers]

