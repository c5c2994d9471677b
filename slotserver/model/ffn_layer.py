"""A layer that is an FFN alone: Nemotron-H's MLP blocks (llama.cpp's nemotron_h).

Nemotron-H's layers are each one block behind their own RMSNorm (`attn_norm`, whatever the block):
a Mamba-2 mixer (model/recurrent_layer.py, with no FFN after it), attention (weights.py's
attention layer, no FFN either: `ModelSpec.layer_spec` gives those layers d_ff 0), or this: an
MLP with no mixer before it, up -> squared ReLU -> down, no gate (model/relu_sqr.py).

As a `LayerWeights`: qkv and wo None (model.py's loop skips the mixer), ffn_norm the block's norm,
gate_up the up projection alone (`ModelSpec.act` "relu2": no gate half), down. Nemotron 3's
(nemotron_h_moe) FFN blocks are a MoE instead (moe.py: ungated squared-ReLU experts) plus a shared
expert of the same form (`ffn_up_shexp`, `ffn_down_shexp`: gate_up and down here). Nemotron 3
Super's experts work in a latent space: `ffn_latent_down` / `_up` load with the MoE (moe.py's `_routed`).
"""

from __future__ import annotations

from dataclasses import replace

import torch

from slotserver.model.gguf_file import GGUFError, GGUFFile
from slotserver.model.linear import Linear
from slotserver.model.moe_weights import load_moe
from slotserver.model.spec import ModelSpec
from slotserver.model.block_layer import blocks, qlinear
from slotserver.model.weights import LayerWeights, WeightFormat, _kind, _load


def ffn_layer(f: GGUFFile, spec: ModelSpec, i: int, kind: str, dtype: torch.dtype, fmt: WeightFormat,
              q4_kernel=None) -> LayerWeights:
    """Layer i, an MLP block alone: kind "q" keeps GGUF blocks, else `Linear`'s formats."""
    d, ff, p, sfx = spec.d_model, spec.d_ff, f"blk.{i}.", ""
    if spec.moe is not None:
        ff, sfx = spec.moe.d_ff_shared, "_shexp"
    shapes = {"ffn_up" + sfx: (ff, d), "ffn_down" + sfx: (d, ff)}
    up, down = (_linear(f, p + n + ".weight", shape, kind, dtype, fmt, q4_kernel) if ff else None   # ff 0: no shared expert
                for n, shape in shapes.items())
    return LayerWeights(attn_norm=None, qkv=None, wo=None,
                        ffn_norm=_load(f, p + spec.ffn_norm + ".weight", (d,), torch.float32), gate_up=up, down=down,
                        moe=_moe(f, spec, i, kind, dtype, fmt, q4_kernel) if spec.moe is not None else None)


def _moe(f: GGUFFile, spec: ModelSpec, i: int, kind: str, dtype: torch.dtype, fmt: WeightFormat, q4_kernel):
    """Layer i's MoE, with Nemotron 3 Super's latent projections where the file has them (both, or a
    refusal naming the one missing)."""
    p, moe, d = f"blk.{i}.", spec.moe, spec.d_model
    mw = load_moe(f, spec, p, kind, dtype)
    names = [p + n + ".weight" for n in ("ffn_latent_down", "ffn_latent_up")]
    if not moe.latent and not any(n in f.tensors for n in names):
        return mw
    if not moe.latent or not all(n in f.tensors for n in names):
        raise GGUFError(f"{f.path}: layer {i}: ffn_latent_down, ffn_latent_up and moe_latent_size come together "
                        f"(this file has {[n for n in names if n in f.tensors]}, moe_latent_size {moe.latent})")
    down, up = (_linear(f, n, shape, kind, dtype, fmt, q4_kernel) for n, shape in zip(names, ((moe.latent, d), (d, moe.latent))))
    return replace(mw, latent_down=down, latent_up=up)


def _linear(f: GGUFFile, name: str, shape: tuple[int, int], kind: str, dtype: torch.dtype, fmt: WeightFormat, q4_kernel):
    """One tensor as a matmul: its GGUF blocks (kind "q"), else `Linear`'s format for it."""
    if kind == "q":
        return qlinear(f, [blocks(f, name, shape)], [None], False)
    return Linear.build(_load(f, name, shape, dtype), None, _kind(f, name, fmt), fmt.int8_max_rows, fmt.native_max_rows,
                        q4_kernel)
