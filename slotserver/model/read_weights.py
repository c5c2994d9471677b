"""The matmul weights of a GGUF file in a weight format, on a device: what `LlamaModel.from_file`
and a wake from sleep (bundle.py) read; and the check that the kernel set has what the file's
architecture calls.

Why apart from model.py: the forward does not care where its weights came from; the choices made
here are the load's (GGUF blocks as in the file, dequantized for cuBLAS on the card, or blocks for
the card's Triton kernels: model/gpu_weights.py; dequantized where the tensors go: gguf_file.py).
"""

from __future__ import annotations

from dataclasses import replace

import torch

from slotserver.errors import ModuleLoadError
from slotserver.model.gguf_file import GGUFFile
from slotserver.model.gpu_weights import GPU_OP, for_blocks
from slotserver.model.placement import to_device
from slotserver.model.spec import ModelSpec
from slotserver.model.block_layer import block_layer, blocks
from slotserver.model.dense_layer import dense_layer
from slotserver.model.ffn_layer import ffn_layer
from slotserver.model.linear import Linear, QLinear
from slotserver.model.mla_layer import mla_layer
from slotserver.model.recurrent_layer import recurrent_layer
from slotserver.model.weights import (Embedding, LayerWeights, ModelWeights, Progress, WeightFormat, _kind, _load,
                                      _optional)
from slotserver.runtime.kernel_set import KernelSet


def read_weights(f: GGUFFile, spec: ModelSpec, dtype: torch.dtype, kernels: KernelSet, fmt: WeightFormat,
                 device: str = "cpu", progress: Progress | None = None) -> ModelWeights:
    """The matmul weights of `f` in `fmt`, on `device` (a load, and a wake from sleep)."""
    q4 = kernels.modules["q4_matmul"].module if "q4_matmul" in kernels.modules else None
    f.dequant_device = device   # dense weights for a GPU: dequantized there
    if fmt.kind == "blocks":   # GGUF blocks on the card (gpu_weights.py): loaded as `q`, then made ready
        weights = for_blocks(load_weights(f, spec, dtype, progress, replace(fmt, kind="q"), q4), dtype,
                             gpu_formats(kernels), device)
    else:
        weights = load_weights(f, spec, dtype, progress, fmt, q4)
    return weights if device == "cpu" else to_device(weights, device)


def load_weights(f: GGUFFile, spec: ModelSpec, dtype: torch.dtype, progress: Progress | None = None,
                 fmt: WeightFormat = WeightFormat(), q4_kernel=None) -> ModelWeights:
    """q4_kernel: the kernels/q4_matmul.py module (its `pack`), for the int4 formats' AMX copy."""
    total = spec.n_layers + 2
    tick = progress or (lambda done, total: None)
    d, kind = spec.d_model, fmt.resolve(dtype)
    fmt = replace(fmt, kind=kind)   # auto resolved: the dequantized paths below read fmt.kind
    if kind == "q":
        embed = Embedding(blocks=blocks(f, "token_embd.weight", (spec.vocab_size, d)))
    else:
        embed = Embedding(dense=_load(f, "token_embd.weight", (spec.vocab_size, d), dtype))
    tick(1, total)
    layers = []
    for i in range(spec.n_layers):
        layers.append(_layer(f, spec, i, kind, dtype, fmt, q4_kernel))
        tick(i + 2, total)
    out_norm = _load(f, spec.out_norm + ".weight", (d,), torch.float32)
    out_name = "token_embd.weight" if spec.tied_embeddings else "output.weight"
    if kind == "q":
        output = QLinear([embed.blocks if spec.tied_embeddings else blocks(f, out_name, (spec.vocab_size, d))])
    else:
        out_w = embed.dense if spec.tied_embeddings else _load(f, out_name, (spec.vocab_size, d), dtype)
        output = Linear.build(out_w, None, _kind(f, out_name, fmt), fmt.output_max_rows)
    freqs, long = (_optional(f, n, (spec.rope_dim // 2,))
                   for n in ("rope_freqs.weight" if spec.has_rope_freqs else "rope_factors_short.weight",
                             "rope_factors_long.weight"))
    tick(total, total)
    return ModelWeights(embed, layers, out_norm, output, freqs, torch.float32 if kind == "q" else dtype, long)


def _layer(f: GGUFFile, spec: ModelSpec, i: int, kind: str, dtype: torch.dtype, fmt: WeightFormat,
           q4_kernel) -> LayerWeights:
    """Layer i in its loader: an FFN alone (nemotron_h's), a hybrid's recurrent layer, or an
    attention layer, as GGUF blocks (kind "q") or dequantized."""
    at = spec.layer_spec(i)   # lfm2moe's leading dense layers: no MoE; nemotron_h's mixers: no FFN
    if spec.ffn_only and spec.ffn_only[i]:
        return ffn_layer(f, at, i, kind, dtype, fmt, q4_kernel)
    if spec.recurrent is not None and spec.recurrent.layers[i] and not spec.parallel_mixers:
        return recurrent_layer(f, at, i, kind, torch.float32 if kind == "q" else dtype, fmt, q4_kernel)
    if spec.mla is not None:   # deepseek2's latent attention
        return mla_layer(f, at, i, kind, dtype, fmt, q4_kernel)
    lw = block_layer(f, at, i, fmt) if kind == "q" else dense_layer(f, at, i, dtype, fmt, q4_kernel)
    if spec.parallel_mixers:   # falcon-h1: the layer's Mamba-2 mixer beside its attention (its FFN: lw's)
        ssm = recurrent_layer(f, replace(at, d_ff=0), i, kind, torch.float32 if kind == "q" else dtype, fmt, q4_kernel)
        lw = replace(lw, parallel=replace(ssm, attn_norm=lw.attn_norm))   # (one copy of the shared norm)
    return lw


def gpu_formats(kernels: KernelSet) -> frozenset[int]:
    """The GGUF formats the kernel set's qmatmul_gpu multiplies (its FORMATS); none without it."""
    mod = kernels.modules.get(GPU_OP)
    return frozenset(int(t) for t in getattr(mod.module, "FORMATS", ())) if mod is not None else frozenset()


def check_kernels(f: GGUFFile, spec: ModelSpec, kernels: KernelSet) -> None:
    """The kernels this architecture calls, with the options it asks of them (their FUSES), or one
    line naming what is missing: e.g. a lab folder copied before gelu_mul.py existed, or before the
    attention kernels took gpt-oss's sinks (they would ignore them silently)."""
    moe_ops = ("moe_route", "moe_matmul") if spec.moe else ("moe_matmul",) if spec.mla else ()   # (mla: per head)
    kind = spec.recurrent.kind if spec.recurrent is not None else ""
    recurrent_ops = {"gdn": ("delta_net_step",), "shortconv": ("short_conv_step",),
                     "mamba2": ("mamba2_step",)}.get(kind, ())
    gate_ops = {"silu": ("silu_mul",), "gelu": ("gelu_mul",)}.get(spec.act, ())   # relu2: model/relu_sqr.py
    for needed in (*gate_ops, *moe_ops, *recurrent_ops):
        if needed not in kernels.modules:
            raise ModuleLoadError(f"{f.path}: a {spec.arch} model needs the kernel {needed} "
                                  f"(kernels/{needed}.py), absent from the kernels folder")
    asks = {"attention": {"sinks"} if spec.sinks else set(), "paged_attention": {"sinks"} if spec.sinks else set()}
    if spec.moe is not None and spec.moe.act == "swiglu_oai":   # gpt-oss: router and expert biases, swiglu_oai
        asks |= {"moe_route": {"bias"}, "moe_matmul": {"bias", "act"}}
    if spec.moe is not None and spec.moe.act == "relu2":   # nemotron_h_moe: ungated squared-ReLU experts
        asks |= {"moe_matmul": {"act", "relu2"}}
    if kind == "mamba2" and spec.parallel_mixers and any(   # falcon-h1's mixers may lack a group norm (as the loader allows)
            n.endswith(".ssm_in.weight") and n.replace(".ssm_in.", ".ssm_norm.") not in f.tensors for n in f.tensors):
        asks |= {"mamba2_step": {"no_norm"}}
    if spec.moe is not None and any(n.endswith(".exp_probs_b.bias") for n in f.tensors):   # lfm2moe's selection bias
        asks |= {"moe_route": asks.get("moe_route", set()) | {"select_bias"}}
    for op, options in asks.items():
        lacking = options - kernels.fuses.get(op, frozenset())
        if op in kernels.modules and lacking:
            raise ModuleLoadError(f"{f.path}: a {spec.arch} model needs kernels/{op}.py with {', '.join(sorted(lacking))} "
                                  f"(its FUSES); this one predates them (`slotserver lab init --force` makes a new copy)")
