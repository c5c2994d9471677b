"""Load a llama-family model's tensors from a GGUF file: as GGUF blocks (default) or dequantized.

`--weights auto` (the default) / `q`: every matmul weight stays in its GGUF block format, a
zero-copy view of the file's mapping (`QWeight`, computed on by the `qmatmul` kernel): loading
touches no weight bytes, and the pages a step reads are the file's (shared, evictable). Fused
matmuls: gate|up (adjacent in llama.cpp-written files) is one view; q|k|v is not adjacent there
(the file's order is k, output, q, v), so it is copied once into one block tensor (~1/6 of the
layer bytes) where the three share a format: one qmatmul instead of three (measured faster at
decode b=1: see `WeightFormat.fuse_copy`). The embedding is looked up by dequantizing only the
rows asked for; tied output projections compute on the embedding's blocks.

`auto` under float32 is the exact reference mode: the dequantized weights in float32 (what llama.cpp's
F32 run and the tests compare against). `dense` / `int8` / `int4` / `auto8` / `auto4` dequantize at load
(one tensor at a time, never two full copies): see `Linear`. q/k/v are fused into one
`[q+2kv, d_model]` matrix and gate/up into one `[2*d_ff, d_model]` matrix.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Callable

import gguf
import torch

from slotserver.model.gguf_file import GGUFFile, TensorInfo
from slotserver.model.linear import Linear, QLinear
from slotserver.model.moe import MoeWeights
from slotserver.model.moe_weights import load_moe
from slotserver.runtime.experts import Experts
from slotserver.runtime.qblocks import FLOATS, QUANTIZED, QWeight, concat_rows, from_mapped, get_rows, take_rows
from slotserver.model.spec import ModelSpec

if TYPE_CHECKING:
    from slotserver.model.delta_net import GdnParams
    from slotserver.model.mamba2 import Mamba2Params
    from slotserver.model.short_conv import ShortConvParams

Progress = Callable[[int, int], None]


WEIGHT_KINDS = ("auto", "q", "dense", "int8", "int4", "auto8", "auto4", "blocks")   # blocks: CUDA's (gpu_weights.py)


@dataclass(frozen=True)
class WeightFormat:
    """How matmul weights are kept. auto: GGUF blocks + qmatmul, except under float32 (the exact
    dequantized reference); q: GGUF blocks whatever the dtype; blocks: GGUF blocks on a CUDA card
    (model/gpu_weights.py, read by model/read_weights.py); the rest: `Linear`'s formats."""

    kind: str = "auto"
    fuse_copy: bool = True    # q|k|v not adjacent in the file: copy them into one block tensor
    int8_max_rows: int = 8    # with auto/auto4: rows (tokens) up to which the int8/int4 matmul is used
    output_max_rows: int = 4  # the same for the [vocab, d_model] output matmul
    native_max_rows: int = 32  # int4 layers: rows up to which the AMX kernel (kernels/q4_matmul.py) is used

    # Why these thresholds (docs/performance.md; whole decode steps in the model on this CPU, bf16,
    # dense weights pre-blocked for oneDNN): the int8/int4 kernels cost ~linear in rows, the dense
    # GEMM ~flat. Layer matmuls: int4 wins below 8 rows (step 18 vs 30 ms at 2 rows), ties at 8-12,
    # dense wins at 16 (35-37 vs 48 ms). The 49152-row output matmul: dense already wins at 8 rows.

    def __post_init__(self) -> None:
        assert self.kind in WEIGHT_KINDS, f"weights must be one of {', '.join(WEIGHT_KINDS)}, got {self.kind!r}"

    def resolve(self, dtype: torch.dtype) -> str:
        """The kind that loads: auto -> dense under float32 (exact), else q."""
        if self.kind == "auto":
            return "dense" if dtype == torch.float32 else "q"
        return self.kind


@dataclass
class Embedding:
    """Token embedding: dense rows, or GGUF blocks dequantized per lookup (only the rows asked for)."""

    dense: torch.Tensor | None = None    # [vocab, d_model]
    blocks: QWeight | None = None

    def __call__(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens [n] -> float32 [n, d_model]."""
        if self.blocks is not None:
            return get_rows(self.blocks, tokens)
        return self.dense[tokens].float()


MatMul = Linear | QLinear   # both: (x [rows, in], ops) -> [rows, out]


@dataclass
class LayerWeights:
    attn_norm: torch.Tensor | None   # [d_model] (None: no pre-norm, olmo2)
    qkv: MatMul | None           # [(n_heads + 2*n_kv_heads) * head_dim, d_model] (+ bias); None: ffn_layer.py's
    wo: MatMul | None            # [d_model, n_heads * head_dim]
    ffn_norm: torch.Tensor | None    # [d_model]
    gate_up: MatMul | None       # [2 * d_ff, d_model] (relu2: [d_ff, d_model], up alone; a MoE layer: its shared
                                 # expert's, or None; None: a mixer alone, nemotron_h's)
    down: MatMul | None          # [d_model, d_ff]
    q_norm: torch.Tensor | None = None     # [head_dim] per-head RMSNorm of q (qwen3, gemma3)
    k_norm: torch.Tensor | None = None     # [head_dim]
    post_attn_norm: torch.Tensor | None = None  # [d_model] RMSNorm of the attention output (gemma2/3)
    post_ffn_norm: torch.Tensor | None = None   # [d_model] RMSNorm of the FFN output
    moe: MoeWeights | None = None               # router and experts (a mixture-of-experts layer)
    sinks: torch.Tensor | None = None           # [n_heads] float32 attention sink logits (gpt-oss)
    # a hybrid model's recurrent layer (model/delta_net.py, model/short_conv.py): qkv is then its
    # in-projection, wo its out-projection, this the rest (its `run` computes the layer between them)
    recurrent: "GdnParams | ShortConvParams | Mamba2Params | None" = None


@dataclass
class ModelWeights:
    embed: Embedding             # [vocab, d_model]
    layers: list[LayerWeights]
    out_norm: torch.Tensor       # [d_model]
    output: MatMul               # [vocab, d_model] (shares the embedding when tied)
    rope_freqs: torch.Tensor | None  # [rope_dim / 2] frequency divisors (llama3; phi3's short factors)
    act_dtype: torch.dtype = torch.float32   # the matmuls' inputs and outputs (see below)
    rope_long: torch.Tensor | None = None    # [rope_dim / 2] phi3 longrope factors past the trained context

    def matmuls(self) -> list[MatMul]:
        """Every layer's matmuls, then the output projection."""
        return [m for lw in self.layers for m in (lw.qkv, lw.wo, lw.gate_up, lw.down) if m is not None] + [self.output]

    def experts(self) -> list[Experts]:
        """Every MoE layer's expert weights (gate|up, then down)."""
        return [e for lw in self.layers if lw.moe is not None for e in (*lw.moe.gate_up, lw.moe.down)]

    # Why float32 activations around GGUF-block matmuls whatever the dtype (then only the KV cache
    # and attention are bf16, as llama.cpp keeps f32 activations and an f16 cache): qmatmul quantizes
    # its input to 8 bits anyway, at the same speed from float32; rounding to bf16 first and its
    # output to bf16 again cost greedy agreement with the float32 reference on the fixture
    # (tests/test_model_reference.py): 96.5% with bf16 activations, 98.4% with float32.


def load_weights(f: GGUFFile, spec: ModelSpec, dtype: torch.dtype, progress: Progress | None = None,
                 fmt: WeightFormat = WeightFormat(), q4_kernel=None) -> ModelWeights:
    """q4_kernel: the kernels/q4_matmul.py module (its `pack`), for the int4 formats' AMX copy."""
    total = spec.n_layers + 2
    tick = progress or (lambda done, total: None)
    d, kind = spec.d_model, fmt.resolve(dtype)
    fmt = replace(fmt, kind=kind)   # auto resolved: the dequantized paths below read fmt.kind
    if kind == "q":
        embed = Embedding(blocks=_blocks(f, "token_embd.weight", (spec.vocab_size, d)))
    else:
        embed = Embedding(dense=_load(f, "token_embd.weight", (spec.vocab_size, d), dtype))
    tick(1, total)
    layers = []
    for i in range(spec.n_layers):
        at = spec.layer_spec(i)   # lfm2moe's leading dense layers: no MoE; nemotron_h's mixers: no FFN
        if spec.ffn_only and spec.ffn_only[i]:
            from slotserver.model.ffn_layer import ffn_layer
            layers.append(ffn_layer(f, at, i, kind, dtype, fmt, q4_kernel))
        else:
            layers.append(_block_layer(f, at, i, fmt) if kind == "q" else _load_layer(f, at, i, dtype, fmt, q4_kernel))
        tick(i + 2, total)
    out_norm = _load(f, spec.out_norm + ".weight", (d,), torch.float32)
    out_name = "token_embd.weight" if spec.tied_embeddings else "output.weight"
    if kind == "q":
        output = QLinear([embed.blocks if spec.tied_embeddings else _blocks(f, out_name, (spec.vocab_size, d))])
    else:
        out_w = embed.dense if spec.tied_embeddings else _load(f, out_name, (spec.vocab_size, d), dtype)
        output = Linear.build(out_w, None, _kind(f, out_name, fmt), fmt.output_max_rows)
    freqs, long = (_optional(f, n, (spec.rope_dim // 2,))
                   for n in ("rope_freqs.weight" if spec.has_rope_freqs else "rope_factors_short.weight",
                             "rope_factors_long.weight"))
    tick(total, total)
    return ModelWeights(embed, layers, out_norm, output, freqs, torch.float32 if kind == "q" else dtype, long)


def _pre_norm(f: GGUFFile, spec: ModelSpec, name: str) -> torch.Tensor | None:
    """A branch's RMSNorm weight [d_model] float32; None for an architecture without them (olmo2)."""
    return _load(f, name, (spec.d_model,), torch.float32) if spec.pre_norms else None


def _optional(f: GGUFFile, name: str, shape: tuple[int, ...]) -> torch.Tensor | None:
    """A float32 tensor the architecture may or may not have (norms, rope factors)."""
    return _load(f, name, shape, torch.float32) if name in f.tensors else None


def _norms(f: GGUFFile, spec: ModelSpec, p: str) -> dict[str, torch.Tensor | None]:
    """The optional per-layer norms; q/k norm weights reordered like the q/k rows (neox -> pairs)."""
    d, hd = spec.d_model, spec.head_dim
    qs, ks = (spec.n_heads * hd, spec.n_kv_heads * hd) if spec.qk_norm_full else (hd, hd)   # olmoe: whole q, k
    q_norm, k_norm = (_optional(f, p + n, (r,)) for n, r in (("attn_q_norm.weight", qs), ("attn_k_norm.weight", ks)))
    if spec.qk_norm and (q_norm is None or k_norm is None):
        f.require(p + "attn_q_norm.weight", (qs,)), f.require(p + "attn_k_norm.weight", (ks,))
    if spec.rope_mode == "neox" and q_norm is not None:
        q_norm, k_norm = _neox_to_normal(q_norm, spec), _neox_to_normal(k_norm, spec)
    post = [_optional(f, p + n, (d,)) for n in ("post_attention_norm.weight", "post_ffw_norm.weight")]
    if spec.post_norms and None in post:
        f.require(p + "post_attention_norm.weight", (d,)), f.require(p + "post_ffw_norm.weight", (d,))
    return dict(q_norm=q_norm if spec.qk_norm else None, k_norm=k_norm if spec.qk_norm else None,
                post_attn_norm=post[0] if spec.post_norms else None, post_ffn_norm=post[1] if spec.post_norms else None)


def _qkv_rows(spec: ModelSpec) -> list[int]:
    """Row order of a fused q|k|v tensor taking q and k heads from neox pairs to adjacent ones."""
    q_rows, kv_rows = spec.n_heads * spec.head_dim, spec.n_kv_heads * spec.head_dim
    return (_neox_rows(spec, q_rows) + [q_rows + r for r in _neox_rows(spec, kv_rows)]
            + list(range(q_rows + kv_rows, q_rows + 2 * kv_rows)))


def gated_q_rows(spec: ModelSpec) -> tuple[list[int], list[int]]:
    """(q rows, gate rows) of a gated attn_q (qwen35: per head, head_dim q rows then head_dim gate rows)."""
    hd = spec.head_dim
    return ([h * 2 * hd + j for h in range(spec.n_heads) for j in range(hd)],
            [h * 2 * hd + hd + j for h in range(spec.n_heads) for j in range(hd)])


def _block_layer(f: GGUFFile, spec: ModelSpec, i: int, fmt: WeightFormat) -> LayerWeights:
    """One layer's matmuls as GGUF blocks (q/k rows reordered for neox rope: a copy of those two)."""
    if spec.recurrent is not None and spec.recurrent.layers[i]:
        from slotserver.model.recurrent_layer import recurrent_layer
        return recurrent_layer(f, spec, i, "q", torch.float32, fmt)
    d, hd, p = spec.d_model, spec.head_dim, f"blk.{i}."
    q_rows, kv_rows = spec.n_heads * hd, spec.n_kv_heads * hd
    if p + "attn_qkv.weight" in f.tensors:   # phi3: q|k|v already one tensor
        qkv_w = _blocks(f, p + "attn_qkv.weight", (q_rows + 2 * kv_rows, d))
        qkv = _qlinear(f, [take_rows(qkv_w, _qkv_rows(spec)) if spec.rope_mode == "neox" else qkv_w], [None], False)
    else:
        qkv = _block_qkv(f, spec, p, fmt)
    gate_up, down = _block_ffn(f, spec, p, fmt)
    return LayerWeights(
        attn_norm=_pre_norm(f, spec, p + "attn_norm.weight"),
        qkv=qkv,
        wo=_qlinear(f, [_blocks(f, p + "attn_output.weight", (d, q_rows))], [None], False, _out_bias(f, spec, p)),
        ffn_norm=_pre_norm(f, spec, p + spec.ffn_norm + ".weight"),
        gate_up=gate_up,
        down=down,
        **_norms(f, spec, p),
        moe=load_moe(f, spec, p, "q", torch.float32) if spec.moe else None,
        sinks=_sinks(f, spec, p),
    )


def _out_bias(f: GGUFFile, spec: ModelSpec, p: str) -> torch.Tensor | None:
    """attn_output.bias [d_model] float32 where the architecture has one (gpt-oss)."""
    return _load(f, p + "attn_output.bias", (spec.d_model,), torch.float32) if spec.out_bias else None


def _sinks(f: GGUFFile, spec: ModelSpec, p: str) -> torch.Tensor | None:
    """attn_sinks.weight [n_heads] float32 (gpt-oss): one logit per query head, joining the softmax
    denominator of every query (kernels/attention.py). Per head, so neox's row order leaves it be."""
    return _load(f, p + "attn_sinks.weight", (spec.n_heads,), torch.float32).contiguous() if spec.sinks else None


def _block_ffn(f: GGUFFile, spec: ModelSpec, p: str, fmt: WeightFormat) -> tuple[QLinear | None, QLinear | None]:
    """(gate|up, down) as GGUF blocks: the dense FFN, a MoE layer's shared expert, or (None, None)."""
    d, ff, sfx = spec.d_model, spec.d_ff, ""
    if not ff and not spec.moe:   # a mixer alone (nemotron_h)
        return None, None
    if spec.moe:
        if not spec.moe.d_ff_shared:
            return None, None
        ff, sfx = spec.moe.d_ff_shared, "_shexp"
    if spec.fused:   # phi3: ffn_up holds gate|up
        gate_up = _qlinear(f, [_blocks(f, p + "ffn_up.weight", (2 * ff, d))], [None], False)
    else:
        names = ("ffn_gate" + sfx, "ffn_up" + sfx)
        gate_up = _qlinear(f, [_blocks(f, p + n + ".weight", (ff, d)) for n in names],
                           [f.tensors[p + n + ".weight"] for n in names], fmt.fuse_copy)
    return gate_up, _qlinear(f, [_blocks(f, p + "ffn_down" + sfx + ".weight", (d, ff))], [None], False)


def _block_qkv(f: GGUFFile, spec: ModelSpec, p: str, fmt: WeightFormat) -> QLinear:
    """Separate q, k, v tensors as one QLinear (q/k rows reordered for neox rope: a copy of those two)."""
    d, hd = spec.d_model, spec.head_dim
    q_rows, kv_rows = spec.n_heads * hd, spec.n_kv_heads * hd
    gate = None
    if spec.attn_gate:   # qwen35: each head's q rows then its output gate's; the gates go last
        both = _blocks(f, p + "attn_q.weight", (2 * q_rows, d))
        q, gate = (take_rows(both, rows) for rows in gated_q_rows(spec))
    else:
        q = _blocks(f, p + "attn_q.weight", (q_rows, d))
    k = _blocks(f, p + "attn_k.weight", (kv_rows, d))
    v = _blocks(f, p + "attn_v.weight", (kv_rows, d))
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
    return _qlinear(f, parts, infos + [None] * (len(parts) - 3), fmt.fuse_copy, bias)


def _blocks(f: GGUFFile, name: str, shape: tuple[int, int]) -> QWeight:
    """A tensor's GGUF blocks, viewed in the file's mapping (no copy, nothing read yet)."""
    info = f.require(name, shape)
    return from_mapped(f.mapped_bytes(info.offset, info.n_bytes), info.ggml_type, shape)


def _qlinear(f: GGUFFile, parts: list[QWeight], infos: list[TensorInfo | None], copy: bool,
             bias: torch.Tensor | None = None):
    """Parts stacked along `out`: runs of one format become one QWeight (a view of the file where
    their bytes are adjacent there, else a copy if `copy`); a format qmatmul lacks: dense float32."""
    if any(int(w.qtype) not in _SERVED for w in parts):
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
        if len(ws) > 1 and all(fi) and all(a.offset + a.n_bytes == b.offset for a, b in zip(fi, fi[1:])):
            n = sum(w.n for w in ws)
            out.append(from_mapped(f.mapped_bytes(fi[0].offset, sum(i.n_bytes for i in fi)), ws[0].qtype, (n, ws[0].k)))
        elif len(ws) > 1 and copy:
            out.append(concat_rows(ws))
        else:
            out.extend(ws)
    return QLinear(out, bias)


_SERVED = {int(t) for t in QUANTIZED + tuple(FLOATS)}   # the formats kernels/qmatmul.py computes on


def _neox_rows(spec: ModelSpec, n: int) -> list[int]:
    """Row order taking each head from neox rope pairs to adjacent ones (see `_neox_to_normal`)."""
    hd, half = spec.head_dim, spec.rope_dim // 2
    order = [j for i in range(half) for j in (i, i + half)] + list(range(spec.rope_dim, hd))
    return [h * hd + o for h in range(n // hd) for o in order]


def _load_layer(f: GGUFFile, spec: ModelSpec, i: int, dtype: torch.dtype, fmt: WeightFormat,
                q4_kernel=None) -> LayerWeights:
    if spec.recurrent is not None and spec.recurrent.layers[i]:
        from slotserver.model.recurrent_layer import recurrent_layer
        return recurrent_layer(f, spec, i, fmt.kind, dtype, fmt, q4_kernel)
    d, hd, p = spec.d_model, spec.head_dim, f"blk.{i}."
    q_rows, kv_rows = spec.n_heads * hd, spec.n_kv_heads * hd
    if p + "attn_qkv.weight" in f.tensors:   # phi3: q|k|v already one tensor
        q, k, v = _load(f, p + "attn_qkv.weight", (q_rows + 2 * kv_rows, d), dtype).split([q_rows, kv_rows, kv_rows])
        qkv_names = ["attn_qkv"]
    else:
        q = _load(f, p + "attn_q.weight", (2 * q_rows if spec.attn_gate else q_rows, d), dtype)
        k = _load(f, p + "attn_k.weight", (kv_rows, d), dtype)
        v = _load(f, p + "attn_v.weight", (kv_rows, d), dtype)
        qkv_names = ["attn_q", "attn_k", "attn_v"]
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
    ff, sfx = (spec.moe.d_ff_shared, "_shexp") if spec.moe else (spec.d_ff, "")
    if spec.fused:   # phi3: ffn_up holds gate|up
        gate_up, gate_up_names = _load(f, p + "ffn_up.weight", (2 * ff, d), dtype), ["ffn_up"]
    elif ff:         # a MoE layer without a shared expert has no dense FFN
        gate_up_names = ["ffn_gate" + sfx, "ffn_up" + sfx]
        gate_up = torch.cat([_load(f, p + n + ".weight", (ff, d), dtype) for n in gate_up_names])

    def lin(names: list[str], w: torch.Tensor, b: torch.Tensor | None = None) -> Linear:
        kinds = {_kind(f, p + n + ".weight", fmt) for n in names}
        return Linear.build(w, b, kinds.pop() if len(kinds) == 1 else _no_int4(fmt.kind), fmt.int8_max_rows,
                            fmt.native_max_rows, q4_kernel)

    return LayerWeights(
        attn_norm=_pre_norm(f, spec, p + "attn_norm.weight"),
        qkv=lin(qkv_names, torch.cat([q, k, v] + ([gate] if gate is not None else [])), bias),
        wo=lin(["attn_output"], _load(f, p + "attn_output.weight", (d, spec.n_heads * hd), dtype),
               None if not spec.out_bias else _out_bias(f, spec, p).to(dtype)),
        ffn_norm=_pre_norm(f, spec, p + spec.ffn_norm + ".weight"),
        gate_up=lin(gate_up_names, gate_up) if ff else None,
        down=lin(["ffn_down" + sfx], _load(f, p + "ffn_down" + sfx + ".weight", (d, ff), dtype)) if ff else None,
        **_norms(f, spec, p),
        moe=load_moe(f, spec, p, fmt.kind, dtype) if spec.moe else None,
        sinks=_sinks(f, spec, p),
    )


def _no_int4(kind: str) -> str:
    return {"int4": "int8", "auto4": "auto8"}.get(kind, kind)


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
