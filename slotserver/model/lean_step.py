"""The layers with fewer launches: the forward's body for the Triton kernels (the CUDA path).

Why: on an H100 a decode step of Qwen2.5-0.5B replayed from a CUDA graph took 1.35 ms at batch 1
against 0.34 ms for its bytes (docs/gpu.md, second round): it is launch-bound, every launch costing
2-5 us whatever its bytes. The CPU body (model.py `_body`) runs, per layer,

    rms_norm, cast to bf16, qkv matmul, rope, K/V write, attention (+ merge), wo matmul, x += ...,
    rms_norm, cast, gate|up matmul, silu_mul, down matmul, x += ...

where the residual `x` is float32 and the matmuls bf16. Here each residual add is done by the
next pre-norm's kernel, which also stores its rows in the matmul dtype (kernels/rms_norm.py FUSES
`add`, `out_dtype`):

    h = rms_norm(x, attn_norm, out_dtype=bf16)                        # layer 0 only
    per layer: qkv(h) [bias in cuBLAS's epilogue], rope, K/V write, attention, wo,
               h = rms_norm(x, ffn_norm, add=wo_out, out_dtype=bf16)  # x += wo_out; h = norm(x)
               gate|up(h), silu_mul, down,
               h = rms_norm(x, next layer's attn_norm (or the output norm), add=down_out, ...)

add + norm + cast, three launches twice a layer, become one each: 4 fewer launches per layer
(playground/decode_launches.py counts them). The floats are those of the unfused kernels: the add
is the same float32 add, the norm the same float32 row, the cast the same one rounding.

Which steps: `applies` says; the CPU keeps `_body` (its own fusions run inside qmatmul's C, and its
floats are pinned by tests), and so do architectures whose branches are not added as they are
(post-norms, residual scales: gemma2/3, granite) and MoE models. A lab reload of rms_norm without
these FUSES falls back to `_body` at the next step.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from slotserver.model.linear import QLinear
from slotserver.runtime.batch import Batch
from slotserver.runtime.kernel_set import KernelSet

if TYPE_CHECKING:
    from slotserver.model.model import LlamaModel

NEEDS = frozenset({"add", "out_dtype"})   # rms_norm's FUSES this body calls


def applies(model: "LlamaModel", ops: KernelSet) -> bool:
    """Whether this step runs the lean body: Triton kernels, a plain dense model (branches added as
    they are, no MoE), an rms_norm that fuses the add and the cast, and no fusing qmatmul on GGUF
    blocks (which folds norm, gate and add into its own launches)."""
    if ops.impl != "triton" or not model._plain or model.spec.moe is not None:
        return False
    if not NEEDS <= ops.fuses.get("rms_norm", frozenset()):
        return False
    qmatmul_fuses = ops.fuses.get("qmatmul", frozenset()) >= {"norm", "glu", "acc"}
    return not (qmatmul_fuses and isinstance(model.weights.layers[0].qkv, QLinear))


def lean_body(model: "LlamaModel", x: torch.Tensor, angles: dict, batch: Batch, cache) -> torch.Tensor:
    """The layers on the embedded batch `x` ([tokens, d_model] float32, updated in place) ->
    the output-normed rows of `batch.logits_rows` in the matmul dtype ([rows, d_model])."""
    s, w, ops = model.spec, model.weights, model.kernels
    act, eps, layers = w.act_dtype, s.norm_eps, w.layers
    all_rows = batch.logits_rows.shape[0] == batch.n_tokens
    gate = ops.silu_mul if s.act != "gelu" else ops.gelu_mul
    h = ops.rms_norm(x, layers[0].attn_norm, eps, out_dtype=act)               # [tokens, d_model] act
    for i, lw in enumerate(layers):
        qkv = lw.qkv(h, ops)                                                    # [tokens, q + 2 kv]
        a = model._attention(i, lw, qkv, batch, cache, *angles[id(model.layer_ropes[i])])
        h = ops.rms_norm(x, lw.ffn_norm, eps, add=lw.wo(a, ops), out_dtype=act)   # x += a wo^T; norm
        down = lw.down(gate(lw.gate_up(h, ops)), ops)                          # [tokens, d_model] act
        nxt = layers[i + 1].attn_norm if i + 1 < len(layers) else (w.out_norm if all_rows else None)
        if nxt is None:   # a prompt chunk: only some rows are normed for logits, after the add
            x.add_(down)
        else:
            h = ops.rms_norm(x, nxt, eps, add=down, out_dtype=act)
    if all_rows:
        return h
    return ops.rms_norm(x[batch.logits_rows], w.out_norm, eps, out_dtype=act)
