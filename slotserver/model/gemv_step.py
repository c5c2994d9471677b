"""The CUDA decode body on the fused GEMV kernels (kernels/gemv.py): ~6 launches a layer instead of ~10.

Why: a Qwen2.5-0.5B decode step on an H100, replayed from a CUDA graph, takes 1.12 ms against
0.34 ms of bytes (docs/gpu.md, third round), and its time is its kernels' fixed latencies: cuBLAS's
small-M matmuls (with a split-K reduce each), the norms, rope, the activation. lean_step.py runs,
per layer,

    qkv (cuBLAS, bias in its epilogue), rope, K/V write, attention (+ merge), wo (cuBLAS),
    rms_norm(x += wo_out), gate|up (cuBLAS), silu_mul, down (cuBLAS), rms_norm(x += down_out)

and this body

    gemv(x; norm, bias, rope) -> qkv    K/V write, attention (+ merge),
    gemv(a; x += a wo^T),  gemv(x; norm, silu(g) * u) -> g,  gemv(g; x += g down^T)

The norm moves into the next matmul's prologue (each program recomputes its rows' sum of squares),
the residual add into the wo / down store (x += y rounded to the activation dtype: the floats of
`x += y` after an unfused matmul), rope and the bias into qkv's store, the gate into gate|up's.
Every fusion gives the unfused floats up to the dot's summation order (kernels/gemv.py's TOL).

Which steps: `applies` says. Only where the switch is on (`ModelConfig.fused_gemv`, the model's
`fused_gemv`: off by default, as an H200 measured it (docs/gpu.md, fourth round); playground/gpu_model_bench.py
--fused-gemv off,on is the A/B), on the lean body's models (lean_step.applies: Triton kernels, plain
dense, no MoE), with dense `Linear` weights (`--gpu-weights dense`: GGUF blocks keep qmatmul_gpu),
a loaded `gemv` kernel that fuses what this body asks, and at most its SMALL_M rows: prefill
chunks keep cuBLAS (lean_step.py). A lab reload of gemv without these FUSES falls back there too.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from slotserver.model.attention_branch import attention
from slotserver.model.linear import Linear
from slotserver.runtime.batch import Batch
from slotserver.runtime.kernel_set import KernelSet

if TYPE_CHECKING:
    from slotserver.model.model import LlamaModel
    from slotserver.model.weights import LayerWeights

NEEDS = frozenset({"norm", "bias", "glu", "rope", "acc"})   # gemv's FUSES this body calls


def applies(model: "LlamaModel", ops: KernelSet, batch: Batch) -> bool:
    """Whether this step runs the GEMV body (the caller has checked lean_step.applies)."""
    if not model.fused_gemv or not NEEDS <= ops.fuses.get("gemv", frozenset()):
        return False
    if batch.n_tokens > getattr(ops.modules["gemv"].module, "SMALL_M", 0):
        return False
    return all(_dense(getattr(model.weights.layers[0], name)) for name in ("qkv", "wo", "gate_up", "down"))


def _dense(lin) -> bool:
    """A plain dense matrix (no int8/int4 copies, no oneDNN blocking): what F.linear would multiply."""
    return (isinstance(lin, Linear) and lin.dense is not None and lin.packed is None and lin.q8 is None
            and lin.q4 is None and lin.q4n is None)


def gemv_body(model: "LlamaModel", x: torch.Tensor, angles: dict, batch: Batch, cache) -> torch.Tensor:
    """The layers on the embedded batch `x` ([tokens, d_model] float32, updated in place) -> the
    output-normed rows of `batch.logits_rows` in the matmul dtype ([rows, d_model])."""
    s, w, ops = model.spec, model.weights, model.kernels
    eps, glu = s.norm_eps, "gelu" if s.act == "gelu" else "silu"
    for i, lw in enumerate(w.layers):
        cos, sin = angles[id(model.layer_ropes[i])]
        a = _attention(model, i, lw, x, batch, cache, cos, sin)                   # [tokens, q_size] act
        ops.gemv(a, lw.wo.dense, lw.wo.bias, "", None, eps, x)                    # x += a wo^T
        g = ops.gemv(x, lw.gate_up.dense, None, glu, lw.ffn_norm, eps)            # [tokens, d_ff] act
        ops.gemv(g, lw.down.dense, lw.down.bias, "", None, eps, x)                # x += g down^T
    rows = x if batch.logits_rows.shape[0] == batch.n_tokens else x[batch.logits_rows]
    return ops.rms_norm(rows, w.out_norm, eps, out_dtype=w.act_dtype)


def _attention(model: "LlamaModel", i: int, lw: "LayerWeights", x: torch.Tensor, batch: Batch, cache,
               cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Layer i's attention from the residual x: q|k|v normed, biased and (q, k) rotated in one launch,
    K/V written, attended. Per-head q/k norms (qwen3, gemma3) come before rope: those models take
    the product without rope and attention_branch.attention (norm, rope, write, attend)."""
    s, ops, n = model.spec, model.kernels, batch.n_tokens
    qk_cols = (s.n_heads + s.n_kv_heads) * s.head_dim
    if lw.q_norm is not None:
        qkv = ops.gemv(x, lw.qkv.dense, lw.qkv.bias, "", lw.attn_norm, s.norm_eps)
        return attention(model, i, lw, qkv, batch, cache, cos, sin)
    qkv = ops.gemv(x, lw.qkv.dense, lw.qkv.bias, "", lw.attn_norm, s.norm_eps, None, cos, sin, s.head_dim, qk_cols)
    q = qkv[:, : s.n_heads * s.head_dim].view(n, s.n_heads, s.head_dim)           # views of the rotated rows
    k = qkv[:, s.n_heads * s.head_dim: qk_cols].view(n, s.n_kv_heads, s.head_dim)
    v = qkv[:, qk_cols:].view(n, s.n_kv_heads, s.head_dim)
    cache.write(i, batch.token_streams, batch.positions, k, v)
    kv = cache.view(i)                                                            # StridedKV or PagedKV
    attend = ops.paged_attention if kv.paged else ops.attention
    a = attend(q, kv, batch.attn.with_layer(s.window(i), s.attn_softcap, lw.sinks), s.q_scale)  # [tokens, heads, hd]
    a = a.reshape(n, s.n_heads * s.head_dim)
    return a if a.dtype == model.weights.act_dtype else a.to(model.weights.act_dtype)
