"""The mixture-of-experts FFN: router, top-k gating, the experts' matmuls, the shared expert.

What llama.cpp's `build_moe_ffn` computes for one layer on the normed rows h `[T, d_model]`:

    logits  = h @ W_router^T                         # [T, E]       float32 (the router is kept dense, summed in f64)
    ids, w  = route(logits)                          # [T, k] each  (moe_spec.py: gating, renormalization)
    gu      = moe_matmul(h, gate|up experts, ids)    # [T, k, 2 F]  each slot its expert's gate|up
    out     = moe_matmul(gu, down experts, ids, glu, w)  # [T, d]   silu(gate) * up, down, sum_j w_j y_j
    (+ shared expert FFN(h), times sigmoid(h . w_shared_gate) where the file has that gate)

The experts' matmuls are a kernel (kernels/moe_matmul.py: rows grouped by expert, each active
expert's blocks read once per step). The routing runs in torch on `[T, E]` logits: small, but
torch computation, so a MoE model's decode steps are not replayed from step graphs
(model.py's `_graph_key`); they run as usual, every step through Python.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from slotserver.model.moe_spec import MoeSpec
from slotserver.runtime.experts import Experts

WEIGHT_SUM_MIN = 6.103515625e-5   # llama.cpp clamps the weights' sum here (float16's smallest normal)


@dataclass
class MoeWeights:
    router: torch.Tensor                  # [E, d_model] float64 (ffn_gate_inp: see router_logits)
    gate_up: list[Experts]                # [E, 2 F, d_model] (one Experts; two where gate and up differ in format)
    down: Experts                         # [E, d_model, F]
    shared_gate: torch.Tensor | None = None  # [1, d_model] float64 (qwen2moe's ffn_gate_inp_shexp)

    def nbytes(self) -> int:
        return sum(e.nbytes() for e in (*self.gate_up, self.down)) + self.router.numel() * 8


def route(logits: torch.Tensor, moe: MoeSpec) -> tuple[torch.Tensor, torch.Tensor]:
    """Router logits [T, E] float32 -> (expert ids [T, k] int64, their weights [T, k] float32),
    llama.cpp's order of operations: probabilities, top k by probability, the selected
    probabilities as weights, then softmax over them (softmax_weight), renormalization, scale."""
    probs = logits.softmax(-1) if moe.gating == "softmax" else logits
    ids = probs.topk(moe.n_used, dim=-1).indices                   # [T, k], largest first
    w = probs.gather(1, ids)
    if moe.gating == "softmax_weight":
        w = w.softmax(-1)
    if moe.norm_weights:
        w = w / w.sum(-1, keepdim=True).clamp_min(WEIGHT_SUM_MIN)
    if moe.weights_scale != 1.0:
        w = w * moe.weights_scale
    return ids, w


def router_logits(h: torch.Tensor, router: torch.Tensor) -> torch.Tensor:
    """h [T, d] @ router^T -> [T, E] float32, the same floats for a row whatever T: summed in
    float64 (router kept float64), rounded once. Why: torch's float32 GEMM blocks by the row
    count (a gemv at one row), so a token's logits moved in their last bits with the batch around
    it, enough to flip a near-tie of the top-k; float64 sums of float32 products differ far below
    float32's rounding, so the rounded logits agree (batch invariance, as every other op keeps it)."""
    return (h.double() @ router.T).float()


def moe_ffn(ops, moe: MoeSpec, mw: MoeWeights, h: torch.Tensor, shared=None) -> torch.Tensor:
    """The routed experts' output on normed rows h [T, d_model] float32 -> [T, d_model] float32.
    shared: the shared expert's FFN as a callable (h -> [T, d_model]), or None."""
    ids, w = route(router_logits(h, mw.router), moe)               # [T, k], [T, k]
    parts = [ops.moe_matmul(h, e, ids) for e in mw.gate_up]        # [T, k, 2F] (or [T, k, F] twice)
    gu = parts[0] if len(parts) == 1 else torch.cat(parts, dim=-1)
    out = ops.moe_matmul(gu, mw.down, ids, glu=True, weights=w)    # [T, d_model], summed in slot order
    if shared is not None:
        s = shared(h)
        if mw.shared_gate is not None:
            s = s * torch.sigmoid(router_logits(h, mw.shared_gate))   # [T, 1]
        out += s
    return out
