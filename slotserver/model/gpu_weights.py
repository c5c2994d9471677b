"""Matmul weights on a CUDA device: `--gpu-weights auto|dense|blocks` (ModelConfig.gpu_weights).

- `dense`: every matmul weight dequantized at load to the compute dtype (bf16) and multiplied by
  cuBLAS (`F.linear`): 2 bytes per weight whatever the file (a 0.5B Q4_K_M: 330 MB -> 988 MB; an
  8B: 4.9 GB -> 16 GB; a 70B Q4_K, 40 GB, does not fit an 80 GB card).
- `blocks`: the file's GGUF blocks copied to the card as they are and multiplied by
  kernels/qmatmul_gpu.py (dequantized in registers): the bytes a decode step reads are the file's.
  Formats without a kernel there (Q2_K, Q3_K, the IQ types) are dequantized at load for cuBLAS;
  floats (F32/F16/BF16 files) too, being dense already. The token embedding stays blocks, its
  looked-up rows dequantized on the card by runtime/torch_dequant.py (qblocks.get_rows; a tied
  output projection multiplies the same bytes), except in a format torch_dequant lacks (then a
  dense table); MoE experts are dense (the Triton moe_matmul reads dense experts), as `dense` loads
  them: every format that loads on the CPU loads.
- `auto`: `dense` where its copy fits in DENSE_SHARE of the card's free memory, else `blocks`.
  Why only one form, never both: keeping the dense copy beside the blocks costs 1.3-1.6x the dense
  bytes, the memory the KV cache needs; and why dense while it fits: on an H200 (docs/gpu.md,
  fourth round) an 8B Q4_K decode step on its blocks (the wide dp4a GEMV) took 4.17 ms at one row
  against 4.63 dense, but 17.2 against 5.1 at 8 rows: a server batches, so dense wins where it
  fits; `--gpu-weights blocks` is the one-stream choice. (Those blocks steps ran the old layer
  body, 4 launches a layer more than blocks run now: model/lean_step.py; not yet re-measured.)
"""

from __future__ import annotations

from dataclasses import replace

import gguf
import torch

from slotserver.model.config import ModelConfig
from slotserver.model.gguf_file import GGUFFile
from slotserver.model.linear import Linear, QLinear
from slotserver.model.moe import MoeWeights
from slotserver.model.weights import Embedding, ModelWeights
from slotserver.runtime.experts import Experts
from slotserver.runtime import torch_dequant
from slotserver.runtime.qblocks import FLOATS, QWeight, dequantize

DENSE_SHARE = 0.5   # of the card's free memory the dense copy may take (the rest: KV cache, graphs, activations)
GPU_OP = "qmatmul_gpu"   # the kernel module that multiplies blocks on the card
_FLOAT_TYPES = {torch.float32: gguf.GGMLQuantizationType.F32, torch.float16: gguf.GGMLQuantizationType.F16,
                torch.bfloat16: gguf.GGMLQuantizationType.BF16}


def dense_bytes(f: GGUFFile, dtype_bytes: int = 2) -> int:
    """Bytes of every 2-D+ tensor (matmul weights, embedding, experts) dequantized to `dtype_bytes`."""
    total = 0
    for info in f.tensors.values():
        if len(info.shape) >= 2:
            n = 1
            for d in info.shape:
                n *= d
            total += n * dtype_bytes
    return total


def choose(policy: str, dense: int, free: int) -> str:
    """`auto` -> "dense" when `dense` bytes fit in DENSE_SHARE of `free`, else "blocks"; the others as given."""
    if policy != "auto":
        return policy
    return "dense" if dense <= DENSE_SHARE * free else "blocks"


def resolve(config: ModelConfig, f: GGUFFile) -> ModelConfig:
    """The config with `gpu_weights` auto resolved for this file and card (once, at load: a wake
    from sleep reloads the same form). Off CUDA, or with --weights other than auto: unchanged."""
    if config.resolved_device != "cuda" or config.gpu_weights != "auto" or config.weights != "auto":
        return config
    free, _ = torch.cuda.mem_get_info()
    return replace(config, gpu_weights=choose("auto", dense_bytes(f), free))


def for_blocks(w: ModelWeights, dtype: torch.dtype, formats: frozenset[int], device: str = "cpu") -> ModelWeights:
    """Weights loaded as GGUF blocks (`--weights q`'s load, still on the CPU) made ready for the card
    under `blocks`: block matmuls of a served format call `GPU_OP`; everything else dense in `dtype`
    (see the module docstring), dequantized on `device` where runtime/torch_dequant.py has the
    format (gguf's numpy on the CPU otherwise). Activations in `dtype` (the kernel takes bf16 x)."""
    eb = w.embed.blocks
    keep = eb is None or eb.qtype in FLOATS or torch_dequant.ported(eb.qtype)   # looked up on the card (get_rows)
    embed = w.embed if keep else Embedding(dense=_dense(eb, device).to(dtype))
    def layer(lw):   # (falcon-h1's Mamba-2 mixer beside the attention: a LayerWeights of its own)
        return replace(lw, **{name: matmul(getattr(lw, name), dtype, formats, device)
                              for name in ("qkv", "wo", "gate_up", "down")},
                       moe=None if lw.moe is None else _dense_moe(lw.moe, dtype, device, formats),
                       parallel=None if lw.parallel is None else layer(lw.parallel),
                       mla=None if lw.mla is None else replace(lw.mla, q_b=matmul(lw.mla.q_b, dtype, formats, device)))
    return replace(w, embed=embed, layers=[layer(lw) for lw in w.layers], output=matmul(w.output, dtype, formats, device),
                   act_dtype=dtype)


def matmul(lin, dtype: torch.dtype, formats: frozenset[int], device: str = "cpu"):
    """A QLinear whose parts all have a kernel -> the same parts on GPU_OP; otherwise (or a Linear,
    or None) the dense `Linear` in `dtype` (the parts dequantized by gguf, concatenated)."""
    if isinstance(lin, Linear) and lin.q8 is None and lin.q4 is None:   # a format qmatmul lacks: dense at load
        w = lin.dense if lin.dense is not None else lin.packed.to_dense()
        return Linear(w.to(dtype), lin.bias)
    if not isinstance(lin, QLinear):
        return lin
    if all(int(p.qtype) in formats for p in lin.parts):
        return QLinear(lin.parts, lin.bias, op=GPU_OP)
    return Linear.build(torch.cat([_dense(p, device) for p in lin.parts]).to(dtype), lin.bias, "dense", 0)


def _dense(w: QWeight, device: str = "cpu") -> torch.Tensor:
    """W as float32 [n, k]: float formats viewed; torch_dequant on `device` where it has the format
    (bit-exact with gguf, and fast on a GPU); else gguf's numpy dequantizer (on the CPU)."""
    if w.qtype in FLOATS:
        return w.float_view().to(device).float()
    if device != "cpu" and torch_dequant.ported(w.qtype):
        return torch_dequant.dequantize(w.raw.to(device), w.qtype, w.k)
    return dequantize(w)


def _dense_moe(moe: MoeWeights, dtype: torch.dtype, device: str = "cpu",
               formats: frozenset[int] = frozenset()) -> MoeWeights:
    """Experts dequantized to `dtype` (a float QWeight view, what `--weights dense` loads); Nemotron 3
    Super's latent projections as any matmul (`matmul`)."""
    def dense(e: Experts) -> Experts:
        parts = tuple(QWeight(_dense(p, device).to(dtype).contiguous().view(torch.uint8), int(_FLOAT_TYPES[dtype]),
                              p.k, p.n)
                      for p in e.parts)
        return Experts(parts, e.n_expert)
    latent = {name: matmul(getattr(moe, name), dtype, formats, device) for name in ("latent_down", "latent_up")
              if getattr(moe, name) is not None}
    return replace(moe, gate_up=[dense(e) for e in moe.gate_up], down=dense(moe.down), **latent)
