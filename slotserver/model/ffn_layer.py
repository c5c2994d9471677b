"""A layer that is an FFN alone: Nemotron-H's MLP blocks (llama.cpp's nemotron_h).

Nemotron-H's layers are each one block behind their own RMSNorm (`attn_norm`, whatever the block):
a Mamba-2 mixer (model/recurrent_layer.py, with no FFN after it), attention (weights.py's
attention layer, no FFN either: `ModelSpec.layer_spec` gives those layers d_ff 0), or this: an
MLP with no mixer before it, up -> squared ReLU -> down, no gate (model/relu_sqr.py).

As a `LayerWeights`: qkv and wo None (model.py's loop skips the mixer), ffn_norm the block's norm,
gate_up the up projection alone (`ModelSpec.act` "relu2": no gate half), down. Nemotron 3's
(nemotron_h_moe) FFN blocks are a MoE instead (moe.py: ungated squared-ReLU experts) plus a shared
expert of the same form (`ffn_up_shexp`, `ffn_down_shexp`: gate_up and down here). Its larger
models' latent projections (`ffn_latent_down` / `_up`, Nemotron 3 Super) are refused in one line.
"""

from __future__ import annotations

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
        if p + "ffn_latent_down.weight" in f.tensors:
            raise GGUFError(f"{f.path}: layer {i}'s experts work in a latent space (ffn_latent_down, Nemotron 3 "
                            "Super): not supported")
        ff, sfx = spec.moe.d_ff_shared, "_shexp"
    shapes = {"ffn_up" + sfx: (ff, d), "ffn_down" + sfx: (d, ff)}
    if not ff:   # a MoE without a shared expert
        up = down = None
    elif kind == "q":
        up, down = (qlinear(f, [blocks(f, p + n + ".weight", shape)], [None], False) for n, shape in shapes.items())
    else:
        up, down = (Linear.build(_load(f, p + n + ".weight", shape, dtype), None, _kind(f, p + n + ".weight", fmt),
                                 fmt.int8_max_rows, fmt.native_max_rows, q4_kernel) for n, shape in shapes.items())
    return LayerWeights(attn_norm=None, qkv=None, wo=None,
                        ffn_norm=_load(f, p + spec.ffn_norm + ".weight", (d,), torch.float32), gate_up=up, down=down,
                        moe=load_moe(f, spec, p, kind, dtype) if spec.moe is not None else None)
