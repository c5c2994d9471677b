"""Each rank's slice of a loaded model (Megatron's split, as vLLM does it).

Attention is split by KV-head groups: a rank keeps its KV heads, the q heads that read them, their
q|k|v rows and the matching columns of the output projection. The FFN is split by d_ff: gate and up
rows (column-parallel), down columns (row-parallel). The output head keeps a slice of the
vocabulary. Norms, the embedding and the rope tables are replicated. A mixture-of-experts layer
keeps every expert and the router, and splits each expert's d_ff the same way (shard_experts.py);
its shared expert, a dense FFN, is split by its d_ff and summed in the experts' one all-reduce.

Splits may be uneven. Why: the default model (SmolLM2-135M) has 3 KV heads, and `--tp 2` must run
it: rank 0 keeps 2 KV heads (6 q heads), rank 1 one (3 q heads); the all-reduce does not care how
many heads each partial sum came from. Refused in one line: fewer KV heads than ranks, fewer
d_ff units than ranks (the dense FFN's, the experts', a shared expert's), `--weights` formats
kept only in a re-encoded form (int8/int4 copies, oneDNN's packed bf16).

GGUF blocks span columns, never rows: any row split keeps whole blocks, and a column split does
where it falls on a block boundary. d_ff (and each expert's) is cut in units of the down
projection's block, so its column split always does; the attention output's split falls at
KV-group boundaries, and where one is not a block boundary (e.g. 192 columns a group with
256-wide K-quant blocks) that one weight is dequantized to float32 on the rank (logged): right,
slower.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace

import torch

from slotserver.errors import ModuleLoadError
from slotserver.model.linear import Linear, QLinear
from slotserver.model.model import LlamaModel
from slotserver.model.spec import ModelSpec
from slotserver.parallel.comm import Comm
from slotserver.parallel.linears import RowParallel, VocabParallel
from slotserver.parallel.shard_experts import expert_block, shard_experts
from slotserver.parallel.split_norm import SplitNorm
from slotserver.runtime.qblocks import QWeight, block_size, dequantize, take_cols

log = logging.getLogger("slotserver.parallel")

Range = tuple[int, int]


class ShardError(ModuleLoadError):
    """What `--tp N` cannot split: one line, naming the flag or the model's number that blocks it."""


def split(n: int, world: int, unit: int = 1) -> list[Range]:
    """[start, end) of each rank over n items cut in units of `unit`, the first ranks one unit more."""
    units, extra = divmod(n // unit, world)
    out, start = [], 0
    for r in range(world):
        size = (units + (r < extra)) * unit
        out.append((start, start + size))
        start += size
    return out


@dataclass(frozen=True)
class ShardPlan:
    """Which heads, FFN columns and vocabulary rows each rank keeps."""

    world: int
    kv_heads: list[Range]    # per rank, [h0, h1) of the KV heads
    ff: list[Range]          # per rank, [f0, f1) of d_ff (MoE: of the shared expert's; (0, 0) without one)
    vocab: list[Range]       # per rank, rows of the output head
    experts_ff: list[Range] | None = None   # per rank, [f0, f1) of every expert's d_ff (MoE models)

    @classmethod
    def make(cls, model: LlamaModel, world: int) -> "ShardPlan":
        s, layers = model.spec, model.weights.layers
        if s.recurrent is not None:
            raise ShardError(f"--tp {world}: {s.arch}'s recurrent layers are not split across ranks (a hybrid model)")
        if s.mla is not None:
            raise ShardError(f"--tp {world}: {s.arch}'s latent attention (one KV head for every query head) is not "
                             "split across ranks")
        if s.n_kv_heads < world:
            raise ShardError(f"--tp {world}: the model has {s.n_kv_heads} KV heads, fewer than the ranks")
        ff, what = (s.d_ff, "d_ff") if s.moe is None else (s.moe.d_ff_shared, "the shared expert's d_ff")
        ffs = _ff_split(world, what, ff, max(_block(lw.down) for lw in layers)) if ff else [(0, 0)] * world
        experts = None
        if s.moe is not None:
            unit = max(expert_block(lw.moe.down) for lw in layers)
            experts = _ff_split(world, "the experts' d_ff", s.moe.d_ff, unit)
        return cls(world, split(s.n_kv_heads, world), ffs, split(s.vocab_size, world), experts)

    def kv_counts(self) -> list[int]:
        return [h1 - h0 for h0, h1 in self.kv_heads]


def _ff_split(world: int, what: str, ff: int, unit: int) -> list[Range]:
    """A d_ff cut in whole `unit`-column blocks of its down projection, at least one a rank."""
    if ff % unit or ff // unit < world:
        raise ShardError(f"--tp {world}: {what} {ff} does not split in {world} parts of whole "
                         f"{unit}-column blocks; use --weights dense")
    return split(ff, world, unit)


def shard_model(model: LlamaModel, comm: Comm, plan: ShardPlan) -> None:
    """Replace the model's weights and spec by this rank's slice (in place); step graphs off (a
    replayed step would skip the collectives, which are Python calls)."""
    s, w, r = model.spec, model.weights, comm.rank
    (h0, h1), (f0, f1), (v0, v1) = plan.kv_heads[r], plan.ff[r], plan.vocab[r]
    g = s.n_heads // s.n_kv_heads
    rows = _qkv_rows(s, h0, h1)
    q_cols = (h0 * g * s.head_dim, h1 * g * s.head_dim)
    layers = []
    for lw in w.layers:
        layers.append(replace(
            lw, qkv=_rows(lw.qkv, rows), wo=RowParallel(_cols(lw.wo, *q_cols), comm, lw.wo.bias),
            **_ffn(lw, comm, plan, s.d_ff if s.moe is None else s.moe.d_ff_shared),
            **_full_norms(lw, s, comm, h0, h1),
            sinks=None if lw.sinks is None else lw.sinks[h0 * g: h1 * g].contiguous()))
    widths = [b - a for a, b in plan.vocab]
    output = VocabParallel(_rows(w.output, list(range(v0, v1))), comm, widths)
    model.weights = replace(w, layers=layers, output=output)
    model.spec = replace(s, n_heads=(h1 - h0) * g, n_kv_heads=h1 - h0)
    if s.moe is None:
        model.spec = replace(model.spec, d_ff=f1 - f0)
    else:
        e0, e1 = plan.experts_ff[r]
        model.spec = replace(model.spec, moe=replace(s.moe, d_ff=e1 - e0, d_ff_shared=f1 - f0))
    model.graphs = None


def _full_norms(lw, s: ModelSpec, comm: Comm, h0: int, h1: int) -> dict:
    """olmoe's q and k norms over the whole projections: this rank's columns (split_norm.py)."""
    if lw.q_norm is None or not s.qk_norm_full:
        return {}
    hd, g = s.head_dim, s.n_heads // s.n_kv_heads
    q = SplitNorm(lw.q_norm[h0 * g * hd: h1 * g * hd].contiguous(), comm, s.n_heads * hd)
    return {"q_norm": q, "k_norm": SplitNorm(lw.k_norm[h0 * hd: h1 * hd].contiguous(), comm, s.n_kv_heads * hd)}


def _ffn(lw, comm: Comm, plan: ShardPlan, ff: int) -> dict:
    """A layer's FFN fields for this rank: the dense FFN's gate|up rows and down columns (its
    all-reduce in RowParallel), or a MoE layer's experts and shared expert, whose partial outputs
    the layer's one all-reduce sums (MoeWeights.all_reduce; a shared expert's down has no bias:
    weights.py loads none)."""
    f0, f1 = plan.ff[comm.rank]
    gate_up = None if lw.gate_up is None else _rows(lw.gate_up, [*range(f0, f1), *range(ff + f0, ff + f1)])
    if lw.moe is None:
        return {"gate_up": gate_up, "down": RowParallel(_cols(lw.down, f0, f1), comm, lw.down.bias)}
    return {"gate_up": gate_up, "down": None if lw.down is None else _cols(lw.down, f0, f1),
            "moe": shard_experts(lw.moe, comm, *plan.experts_ff[comm.rank])}


def _qkv_rows(s: ModelSpec, h0: int, h1: int) -> list[int]:
    """Rows of the fused q|k|v of KV heads [h0, h1) and their q heads (the load's row order)."""
    hd, g = s.head_dim, s.n_heads // s.n_kv_heads
    q_size, kv_size = s.n_heads * hd, s.n_kv_heads * hd
    q = range(h0 * g * hd, h1 * g * hd)
    k = range(q_size + h0 * hd, q_size + h1 * hd)
    v = range(q_size + kv_size + h0 * hd, q_size + kv_size + h1 * hd)
    return [*q, *k, *v]


def _block(lin) -> int:
    """The column granularity of a matmul's weights: its GGUF block (1 for dense)."""
    return max(block_size(p.qtype) for p in lin.parts) if isinstance(lin, QLinear) else 1


def _dense(lin: Linear) -> torch.Tensor:
    if lin.dense is None:
        raise ShardError("--tp shards GGUF blocks (--weights q, the default) and dense float weights; "
                         "this --weights / --dtype keeps re-encoded copies (int8, int4, packed bf16): "
                         "use --weights q or --dtype float32")
    return lin.dense


def _rows(lin, rows: list[int]):
    """The rows `rows` (ascending) of a matmul, as the same kind of matmul."""
    idx = torch.tensor(rows, dtype=torch.long)
    bias = None if lin.bias is None else lin.bias[idx].contiguous()
    if isinstance(lin, Linear):
        return Linear.build(_dense(lin)[idx].contiguous(), bias, "dense", 0)
    parts, offset = [], 0
    for p in lin.parts:   # each part's share of the rows, in order (parts are stacked along out)
        mine = idx[(idx >= offset) & (idx < offset + p.n)] - offset
        if len(mine):
            parts.append(QWeight(p.raw.index_select(0, mine), p.qtype, p.k, len(mine)))
        offset += p.n
    return QLinear(parts, bias, lin.op)


def _cols(lin, c0: int, c1: int):
    """Input columns [c0, c1) of a matmul (its bias stays with the caller: added after the sum)."""
    if isinstance(lin, Linear):
        return Linear.build(_dense(lin)[:, c0:c1].contiguous(), None, "dense", 0)
    block = _block(lin)
    if c0 % block or c1 % block:   # not on a block boundary: this weight's slice dequantized
        log.info("--tp: columns %d:%d cut %d-wide blocks; that slice is dequantized to float32", c0, c1, block)
        dense = torch.cat([dequantize(p)[:, c0:c1] for p in lin.parts])
        return Linear.build(dense.contiguous(), None, "dense", 0)
    return QLinear([take_cols(p, c0, c1) for p in lin.parts], None, lin.op)
