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

On GGUF blocks (qmatmul_gpu) at decode sizes the two norms and the SiLU gate also write their rows'
q8_1 (rms_norm's and silu_mul's FUSES `q8_1`), which the qkv, gate|up and down products read
(qmatmul_gpu's `x_q8`) instead of quantizing their x in a launch of their own: 3 more launches
fewer a layer, the same values (`_quantize32`).

Which steps: `applies` says; the CPU keeps `_body` (its own fusions run inside qmatmul's C, and its
floats are pinned by tests), and so do architectures whose branches are not added as they are
(post-norms, residual scales: gemma2/3, granite) and MoE models. A lab reload of rms_norm without
these FUSES falls back to `_body` at the next step.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from slotserver.model.attention_branch import attention
from slotserver.model.linear import QLinear
from slotserver.runtime.batch import Batch
from slotserver.runtime.kernel_set import KernelSet

if TYPE_CHECKING:
    from slotserver.model.model import LlamaModel

NEEDS = frozenset({"add", "out_dtype"})   # rms_norm's FUSES this body calls
Q8_MAX_ROWS = 16   # steps of up to these rows hand the norms' q8_1 to the matmuls (what the wide / int8 products serve)


def applies(model: "LlamaModel", ops: KernelSet) -> bool:
    """Whether this step runs the lean body: Triton kernels, a plain dense model (branches added as
    they are, no MoE), an rms_norm that fuses the add and the cast, and GGUF blocks (if any) on an
    op that does not fold norm, gate and add into its own launches (qmatmul_gpu does not; the CPU's
    qmatmul does). The blocks' own op is what counts: until 2026-11-27 this asked the CPU's qmatmul
    whatever the op, so `--gpu-weights blocks` never ran this body (docs/gpu.md)."""
    s = model.spec
    if ops.impl != "triton" or not model._plain or s.moe is not None or s.recurrent is not None or s.act == "relu2" \
            or s.mla is not None:   # (deepseek2's latent attention: the layer loop's mla_attention.py)
        return False   # (arcee's ungated squared ReLU: the layer loop's relu_sqr, not this body's gate)
    if not NEEDS <= ops.fuses.get("rms_norm", frozenset()):
        return False
    lin = model.weights.layers[0].qkv
    return not (isinstance(lin, QLinear) and ops.fuses.get(lin.op, frozenset()) >= {"norm", "glu", "acc"})


def lean_body(model: "LlamaModel", x: torch.Tensor, angles: dict, batch: Batch, cache) -> torch.Tensor:
    """The layers on the embedded batch `x` ([tokens, d_model] float32, updated in place) ->
    the output-normed rows of `batch.logits_rows` in the matmul dtype ([rows, d_model])."""
    s, w, ops = model.spec, model.weights, model.kernels
    act, eps, layers = w.act_dtype, s.norm_eps, w.layers
    all_rows = batch.logits_rows.shape[0] == batch.n_tokens
    gate = ops.silu_mul if s.act != "gelu" else ops.gelu_mul
    q8, gq8 = _q8_rows(model, ops, x)                           # the norms' and the gate's q8_1, or None
    with_q8, gate_q8 = ({} if b is None else {"q8_1": b} for b in (q8, gq8))
    h = ops.rms_norm(x, layers[0].attn_norm, eps, out_dtype=act, **with_q8)    # [tokens, d_model] act
    for i, lw in enumerate(layers):
        qkv = _mm(lw.qkv, h, ops, q8)                                           # [tokens, q + 2 kv]
        a = attention(model, i, lw, qkv, batch, cache, *angles[id(model.layer_ropes[i])])
        h = ops.rms_norm(x, lw.ffn_norm, eps, add=lw.wo(a, ops), out_dtype=act, **with_q8)   # x += a wo^T; norm
        g = gate(_mm(lw.gate_up, h, ops, q8), **gate_q8)                       # [tokens, d_ff] act
        down = _mm(lw.down, g, ops, gq8)                                        # [tokens, d_model] act
        last = i + 1 == len(layers)
        nxt = layers[i + 1].attn_norm if not last else (w.out_norm if all_rows else None)
        if nxt is None:   # a prompt chunk: only some rows are normed for logits, after the add
            x.add_(down)
        else:
            h = ops.rms_norm(x, nxt, eps, add=down, out_dtype=act, **({} if last else with_q8))
    if all_rows:
        return h
    return ops.rms_norm(x[batch.logits_rows], w.out_norm, eps, out_dtype=act)


def _q8_rows(model: "LlamaModel", ops: KernelSet, x: torch.Tensor) -> tuple[tuple | None, tuple | None]:
    """Buffers for the q8_1 of a step's normed rows and of its gated rows where each is fused (module
    docstring): GGUF blocks on an op that reads `x_q8`, at most Q8_MAX_ROWS rows, widths of whole
    32-blocks, an rms_norm / silu_mul that writes `q8_1`. Reused by every layer of the step: each
    product reads them before the next norm or gate writes them again."""
    l0, (tokens, d) = model.weights.layers[0], x.shape
    if not (isinstance(l0.qkv, QLinear) and isinstance(l0.down, QLinear) and tokens <= Q8_MAX_ROWS
            and "x_q8" in ops.fuses.get(l0.qkv.op, ())):
        return None, None
    d_ff = l0.down.parts[0].k
    norm = d % 32 == 0 and "q8_1" in ops.fuses.get("rms_norm", ())
    gate = d_ff % 32 == 0 and model.spec.act != "gelu" and "q8_1" in ops.fuses.get("silu_mul", ())
    return (_q8_buffers(tokens, d, x.device) if norm else None), (_q8_buffers(tokens, d_ff, x.device) if gate else None)


def _q8_buffers(rows: int, width: int, device) -> tuple[torch.Tensor, ...]:
    """Empty q8_1 of rows x width values, as kernels/_q8_1.py lays it out (the FUSES' contract)."""
    return (torch.empty(rows, width, dtype=torch.int8, device=device),
            *(torch.empty(rows, width // 32, dtype=torch.float32, device=device) for _ in range(2)))


def _mm(lin, h: torch.Tensor, ops: KernelSet, q8: tuple[torch.Tensor, ...] | None) -> torch.Tensor:
    """lin(h), handing it h's q8_1 where it reads it (a QLinear on an op that takes `x_q8`)."""
    if q8 is not None and isinstance(lin, QLinear) and "x_q8" in ops.fuses.get(lin.op, ()):
        return lin(h, ops, x_q8=q8)
    return lin(h, ops)
