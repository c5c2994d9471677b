"""A model's weights as the forward reads them, and the small readers every layer loader shares.

The types: `WeightFormat` (how matmul weights are kept: `--weights`), `Embedding`, `LayerWeights`
(one layer: an attention layer, a hybrid's recurrent layer, or nemotron_h's FFN alone) and
`ModelWeights`. The loaders, one file each: block_layer.py (GGUF blocks), dense_layer.py
(dequantized), recurrent_layer.py, ffn_layer.py; read_weights.py's `load_weights` runs them over
the file's layers.

`--weights auto` (the default) / `q`: every matmul weight stays in its GGUF block format, a
zero-copy view of the file's mapping (`QWeight`, computed on by the `qmatmul` kernel): loading
touches no weight bytes, and the pages a step reads are the file's (shared, evictable). The
embedding is looked up by dequantizing only the rows asked for; tied output projections compute on
the embedding's blocks.

`auto` under float32 is the exact reference mode: the dequantized weights in float32 (what llama.cpp's
F32 run and the tests compare against). `dense` / `int8` / `int4` / `auto8` / `auto4` dequantize at load
(one tensor at a time, never two full copies): see `Linear`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

import gguf
import torch

from slotserver.model.gguf_file import GGUFFile
from slotserver.model.linear import Linear, QLinear
from slotserver.model.moe import MoeWeights
from slotserver.runtime.experts import Experts
from slotserver.runtime.qblocks import QWeight, get_rows
from slotserver.model.spec import ModelSpec

if TYPE_CHECKING:
    from slotserver.model.delta_net import GdnParams
    from slotserver.model.mamba2 import Mamba2Params
    from slotserver.model.mla_layer import MlaWeights
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
    # falcon-h1: a Mamba-2 mixer beside the attention (a recurrent layer's weights, no FFN), on the
    # same normed input; the two outputs are summed before the residual add
    parallel: "LayerWeights | None" = None
    # deepseek2's latent attention (mla_layer.py): qkv is then q's projection | attn_kv_a_mqa's, this the rest
    mla: "MlaWeights | None" = None


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
        layers = [x for lw in self.layers for x in (lw, lw.parallel) if x is not None]
        latent = [m for lw in layers if lw.moe is not None for m in (lw.moe.latent_down, lw.moe.latent_up)]
        mla = [lw.mla.q_b for lw in layers if lw.mla is not None]
        return [m for lw in layers for m in (lw.qkv, lw.wo, lw.gate_up, lw.down) if m is not None] + \
            [m for m in latent + mla if m is not None] + [self.output]

    def experts(self) -> list[Experts]:
        """Every MoE layer's expert weights (gate|up, then down), then the latent attention's per-head
        products kept as blocks (mla_layer.py): what warm_up repacks before the first request."""
        mla = [e for lw in self.layers if lw.mla is not None for e in (lw.mla.k_b, lw.mla.v_b) if isinstance(e, Experts)]
        return [e for lw in self.layers if lw.moe is not None for e in (*lw.moe.gate_up, lw.moe.down)] + mla

    # Why float32 activations around GGUF-block matmuls whatever the dtype (then only the KV cache
    # and attention are bf16, as llama.cpp keeps f32 activations and an f16 cache): qmatmul quantizes
    # its input to 8 bits anyway, at the same speed from float32; rounding to bf16 first and its
    # output to bf16 again cost greedy agreement with the float32 reference on the fixture
    # (tests/test_model_reference.py): 96.5% with bf16 activations, 98.4% with float32.


def _pre_norm(f: GGUFFile, spec: ModelSpec, name: str) -> torch.Tensor | None:
    """A branch's RMSNorm weight [d_model] float32; None for an architecture without them (olmo2).
    `name` ends in .weight; a file may name it without (llama.cpp's falcon-h1 writes `blk.N.ffn_norm`)."""
    if not spec.pre_norms:
        return None
    bare = name.removesuffix(".weight")
    return _load(f, bare if name not in f.tensors and bare in f.tensors else name, (spec.d_model,), torch.float32)


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


def _out_bias(f: GGUFFile, spec: ModelSpec, p: str) -> torch.Tensor | None:
    """attn_output.bias [d_model] float32 where the architecture has one (gpt-oss)."""
    return _load(f, p + "attn_output.bias", (spec.d_model,), torch.float32) if spec.out_bias else None


def _sinks(f: GGUFFile, spec: ModelSpec, p: str) -> torch.Tensor | None:
    """attn_sinks.weight [n_heads] float32 (gpt-oss): one logit per query head, joining the softmax
    denominator of every query (kernels/attention.py). Per head, so neox's row order leaves it be."""
    return _load(f, p + "attn_sinks.weight", (spec.n_heads,), torch.float32).contiguous() if spec.sinks else None


def _neox_rows(spec: ModelSpec, n: int) -> list[int]:
    """Row order taking each head from neox rope pairs to adjacent ones (see `_neox_to_normal`)."""
    hd, half = spec.head_dim, spec.rope_dim // 2
    order = [j for i in range(half) for j in (i, i + half)] + list(range(spec.rope_dim, hd))
    return [h * hd + o for h in range(n // hd) for o in order]


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
