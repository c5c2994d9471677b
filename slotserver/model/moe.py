"""The mixture-of-experts FFN: router, top-k gating, the experts' matmuls, the shared expert.

What llama.cpp's `build_moe_ffn` computes for one layer on the normed rows h `[T, d_model]`:

    ids, w  = moe_route(h, W_router, k, ...)         # [T, k] each  logits h @ W^T summed in float64, then
                                                     #              moe_spec.py's gating, top-k, renormalization
    gu      = moe_matmul(h, gate|up experts, ids)    # [T, k, 2 F]  each slot its expert's gate|up
    out     = moe_matmul(gu, down experts, ids, glu, w)  # [T, d]   silu(gate) * up, down, sum_j w_j y_j
    (+ shared expert FFN(h), times sigmoid(h . w_shared_gate) where the file has that gate)

The routing and the experts' matmuls are kernels (kernels/moe_route.py: logits, softmax, top-k,
weights in one C call; kernels/moe_matmul.py: rows grouped by expert, each active expert's blocks
read once per step, the weighted sum and the residual add fused): a qwen3moe or olmoe decode step
is C calls only and replays from a step graph like a dense model's. A shared expert without an
output gate (granite MoE shared, Granite 4.0-H-Tiny/Small, nemotron_h_moe) is three more C calls,
its add into the experts' sum (model/scaled_add.py, torch's floats) too: those steps replay. A
gated one (qwen2moe, Qwen3.5 MoE: a float64 router product and a sigmoid) computes its gate in
torch: those steps run as usual.

gpt-oss (`MoeSpec.act` "swiglu_oai", biases in `MoeWeights`) follows llama.cpp's order: the
router bias joins the logits (in moe_route), each slot's gate|up gets its expert's bias, the
clamped SwiGLU feeds the down matmul, each slot's output gets its expert's down bias and only then
its routing weight, and the k weighted outputs are summed in slot order: all inside the two
moe_matmul calls (`bias`, `act="oai"`), so a gpt-oss decode step is C calls only too and replays
from a step graph.

nemotron_h_moe's experts have no gate (`MoeSpec.act` "relu2"): gate_up holds the up rows alone
and the down call squares each row after a ReLU as it gathers it (moe_matmul's `act="relu2"`).

lfm2moe (`MoeSpec.gating` "sigmoid") routes by each logit's sigmoid and chooses the experts with
the layer's selection bias added (`MoeWeights.select_bias`, its `exp_probs_b`; moe_route's
`select_bias`), weighting them by the unbiased sigmoids, renormalized.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

import torch

from slotserver.model.moe_spec import MoeSpec
from slotserver.model.scaled_add import scaled_add
from slotserver.runtime.experts import Experts

if TYPE_CHECKING:
    from slotserver.model.linear import Linear, QLinear

GATING = {"softmax": 0, "softmax_weight": 1, "sigmoid": 2}   # kernels/moe_route.py's codes


@dataclass
class MoeWeights:
    router: torch.Tensor                  # [E, d_model] float64 (ffn_gate_inp: see router_logits)
    gate_up: list[Experts]                # [E, 2 F, d_model] (one Experts; two where gate and up differ in format)
    down: Experts                         # [E, d_model, F]
    shared_gate: torch.Tensor | None = None  # [1, d_model] float64 (qwen2moe's ffn_gate_inp_shexp)
    router_bias: torch.Tensor | None = None  # [E] float32 (gpt-oss's ffn_gate_inp.bias)
    gate_up_bias: torch.Tensor | None = None  # [E, 2 F] float32: gate then up, as an expert's rows
    down_bias: torch.Tensor | None = None    # [E, d_model] float32
    select_bias: torch.Tensor | None = None  # [E] float32 (lfm2moe's exp_probs_b: selects, never weights)
    # Nemotron 3 Super: the experts work in a latent space: [latent, d_model] down before them, [d_model,
    # latent] up after their weighted sum
    latent_down: "Linear | QLinear | None" = None
    latent_up: "Linear | QLinear | None" = None
    # --tp (slotserver/parallel/shard_experts.py): this rank holds a slice of every expert's d_ff
    # (and of the shared expert's), so its output is a partial sum; this sums it over the ranks
    # (one all-reduce a layer), before the residual add. None: one process, the fused add in C.
    all_reduce: Callable[[torch.Tensor], torch.Tensor] | None = None

    def nbytes(self) -> int:
        biases = sum(b.numel() * 4 for b in (self.router_bias, self.gate_up_bias, self.down_bias, self.select_bias)
                     if b is not None)
        return sum(e.nbytes() for e in (*self.gate_up, self.down)) + self.router.numel() * 8 + biases


def router_logits(h: torch.Tensor, router: torch.Tensor) -> torch.Tensor:
    """h [T, d] @ router^T -> [T, E] float32, the same floats for a row whatever T: summed in
    float64 (router kept float64), rounded once. Why: torch's float32 GEMM blocks by the row
    count (a gemv at one row), so a token's logits moved in their last bits with the batch around
    it, enough to flip a near-tie of the top-k; float64 sums of float32 products differ far below
    float32's rounding, so the rounded logits agree (batch invariance, as every other op keeps it).
    kernels/moe_route.py sums the router the same way in C; this serves qwen2moe's shared gate."""
    return (h.double() @ router.T).float()


def route(ops, moe: MoeSpec, mw: MoeWeights, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(expert ids [T, k] int64, weights [T, k] float32) of the normed rows h: the moe_route kernel."""
    args = (h, mw.router, moe.n_used, GATING[moe.gating], moe.norm_weights, moe.weights_scale)
    if mw.select_bias is not None:
        return ops.moe_route(*args, mw.router_bias, mw.select_bias)
    if mw.router_bias is None:   # the call as a lab kernel copied before the bias argument takes it
        return ops.moe_route(*args)
    return ops.moe_route(*args, mw.router_bias)


ACTS = {"silu": "silu", "swiglu_oai": "oai", "relu2": "relu2"}   # MoeSpec.act -> kernels/moe_matmul.py's act


def _part_options(mw: MoeWeights) -> list[dict]:
    """moe_matmul's keyword options for each gate|up call: the expert biases of its columns
    (gpt-oss; none: no options, so a lab copy of moe_matmul from before them still serves)."""
    if mw.gate_up_bias is None:
        return [{} for _ in mw.gate_up]
    if len(mw.gate_up) == 1:
        return [{"bias": mw.gate_up_bias}]
    cols = [e.n for e in mw.gate_up]                               # gate and up in two formats
    return [{"bias": b.contiguous()} for b in mw.gate_up_bias.split(cols, dim=1)]


def _down_options(moe: MoeSpec, mw: MoeWeights) -> dict:
    opts = {} if mw.down_bias is None else {"bias": mw.down_bias}
    return opts if moe.act == "silu" else opts | {"act": ACTS[moe.act]}


def moe_ffn(ops, moe: MoeSpec, mw: MoeWeights, h: torch.Tensor, shared=None,
            acc: torch.Tensor | None = None) -> torch.Tensor:
    """The routed experts' output on normed rows h [T, d_model] float32 -> [T, d_model] float32,
    or added into `acc` (the residual, returned). shared: the shared expert's FFN as a callable
    (h -> [T, d_model]), or None. Without a shared expert and with one format for gate and up, the
    layer is three C calls (route, gate|up, down + sum + residual add): a step graph replays it.
    Under --tp (`mw.all_reduce`) the ranks' partial outputs are summed first, then added into acc."""
    if mw.all_reduce is not None:
        out = mw.all_reduce(_routed(ops, moe, mw, h, shared))   # [T, d_model], the same on every rank
        return out if acc is None else acc.add_(out)
    return _routed(ops, moe, mw, h, shared, acc)


def _routed(ops, moe: MoeSpec, mw: MoeWeights, h: torch.Tensor, shared=None,
            acc: torch.Tensor | None = None) -> torch.Tensor:
    """moe_ffn's computation on this process's weights (under --tp: its partial sum)."""
    ids, w = route(ops, moe, mw, h)                                # [T, k], [T, k]   (the router on the full rows)
    x = h if mw.latent_down is None else mw.latent_down(h, ops)   # Nemotron 3 Super: the experts' latent rows
    parts = [ops.moe_matmul(x, e, ids, **o) for e, o in zip(mw.gate_up, _part_options(mw))]   # [T, k, 2F] (+ biases)
    gu = parts[0] if len(parts) == 1 else torch.cat(parts, dim=-1)
    down = _down_options(moe, mw)                                  # gpt-oss: swiglu_oai, down biases
    glu = moe.act != "relu2"                                       # nemotron_h_moe: up alone, squared ReLU
    if shared is None and mw.latent_up is None:
        return ops.moe_matmul(gu, mw.down, ids, glu=glu, weights=w, acc=acc, **down)   # summed in slot order
    out = ops.moe_matmul(gu, mw.down, ids, glu=glu, weights=w, **down)
    if mw.latent_up is not None:
        out = mw.latent_up(out, ops)                               # [T, d_model]
    if shared is not None:   # (on the full rows)
        s = shared(h)                                              # [T, d_model]
        if mw.shared_gate is not None:
            s = s * torch.sigmoid(router_logits(h, mw.shared_gate))   # [T, 1]
        out = scaled_add(out, s, 1.0)                              # the experts' sum + the shared expert's, in C
    return out if acc is None else scaled_add(acc, out, 1.0)
