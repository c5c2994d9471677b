"""One rank's slice of a mixture-of-experts layer (vLLM's TP MoE without expert parallelism:
Megatron's FFN split applied to every expert).

Every rank keeps every expert, and of each a slice [f0, f1) of its d_ff: the rows e*F + f0 ..
e*F + f1 of gate and of up (column-parallel: the rank's own hidden units of expert e) and the
columns f0 .. f1 of its down projection (row-parallel: a partial sum of expert e's output). The
router stays replicated: every rank routes the same (all-reduced) rows the same way, so the ids
and weights agree on all ranks without a message. One all-reduce a layer (`MoeWeights.all_reduce`,
moe.py) sums the ranks' partial outputs, the shared expert's included, before the residual add.

gpt-oss's biases: `gate_up_bias` [E, 2F] keeps the columns of the rank's rows (f0:f1 of the gate,
F+f0:F+f1 of the up); `down_bias` [E, d_model] joins each slot's output before its routing weight,
so sum_j w_j (y_j + b_j) is sum_j w_j y_j plus sum_j w_j b_j: rank 0 keeps it and the others run
without it (None), and the all-reduce adds it once. MoE steps run eagerly under --tp (step graphs
are off on every rank), so the ranks' different kernel options break no replay.

GGUF blocks span columns: the rows of gate and up are whole rows of blocks, and the down's columns
are cut where the plan says, on the experts' down block boundaries (`expert_block`).
"""

from __future__ import annotations

from dataclasses import replace

import torch

from slotserver.model.moe import MoeWeights
from slotserver.parallel.comm import Comm
from slotserver.runtime.experts import Experts
from slotserver.runtime.qblocks import QWeight, block_size, take_cols


def expert_block(e: Experts) -> int:
    """The column granularity of an expert tensor: its GGUF block (1 for float experts)."""
    return block_size(e.qtype)


def shard_experts(mw: MoeWeights, comm: Comm, f0: int, f1: int) -> MoeWeights:
    """This rank's slice [f0, f1) of every expert's d_ff, its output all-reduced over `comm`."""
    return replace(slice_experts(mw, f0, f1, keeps_down_bias=comm.leads), all_reduce=comm.all_reduce)


def slice_experts(mw: MoeWeights, f0: int, f1: int, keeps_down_bias: bool) -> MoeWeights:
    """The layer's weights for d_ff slice [f0, f1) of every expert (no all-reduce: the caller's)."""
    ff = mw.down.k                                                    # F, one expert's d_ff
    gu_bias = mw.gate_up_bias                                         # [E, 2F]: gate, then up
    if gu_bias is not None:
        gu_bias = torch.cat([gu_bias[:, f0:f1], gu_bias[:, ff + f0: ff + f1]], dim=1).contiguous()   # [E, 2F']
    return replace(mw, gate_up=[expert_rows(e, f0, f1) for e in mw.gate_up], down=expert_cols(mw.down, f0, f1),
                   gate_up_bias=gu_bias, down_bias=mw.down_bias if keeps_down_bias else None)


def expert_rows(e: Experts, f0: int, f1: int) -> Experts:
    """Rows [f0, f1) of each expert in each part (gate|up: the rank's hidden units), as new parts
    [E * (f1 - f0), k] (a copy: index_select of whole rows of blocks)."""
    parts = []
    for p, n in zip(e.parts, e.part_rows):
        rows = (torch.arange(e.n_expert)[:, None] * n + torch.arange(f0, f1)[None, :]).flatten()   # [E * F']
        parts.append(QWeight(p.raw.index_select(0, rows), p.qtype, p.k, len(rows)))
    return Experts(tuple(parts), e.n_expert)


def expert_cols(e: Experts, c0: int, c1: int) -> Experts:
    """Input columns [c0, c1) of every expert (down: [E * d_model, F] -> [E * d_model, c1 - c0]);
    c0 and c1 on the parts' block boundaries (ShardPlan cuts d_ff in whole blocks)."""
    return Experts(tuple(take_cols(p, c0, c1) for p in e.parts), e.n_expert)
