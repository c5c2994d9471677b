"""`Experts`: a mixture-of-experts layer's matmul weights in GGUF blocks, what kernels/moe_matmul.py reads.

A GGUF MoE file stores each projection of all experts as one 3-D tensor (`ffn_gate_exps`,
`ffn_up_exps`, `ffn_down_exps`: `[n_expert, n, k]` in torch order), whose bytes are the experts'
row blocks one after the other. Viewed as rows it is one `QWeight` `[n_expert * n, k]` (a
zero-copy view of the mapped file, like every other weight), and expert e is rows
`[e * n, (e + 1) * n)`. Several parts (gate and up) are stacked along `out` per expert: expert e's
matrix is its gate rows, then its up rows, so one kernel call computes gate|up for every row.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from slotserver.runtime.qblocks import FLOATS, QWeight, dequantize


@dataclass(frozen=True)
class Experts:
    parts: tuple[QWeight, ...]   # each [n_expert * n_p, k], one format for all
    n_expert: int

    def __post_init__(self) -> None:
        assert self.parts and self.n_expert > 0, "Experts: at least one part and one expert"
        first = self.parts[0]
        for p in self.parts:
            assert p.qtype == first.qtype and p.k == first.k, "Experts: parts of one format and k"
            assert p.n % self.n_expert == 0, f"Experts: {p.n} rows is not {self.n_expert} experts' rows"

    @property
    def k(self) -> int:
        return self.parts[0].k

    @property
    def qtype(self) -> int:
        return self.parts[0].qtype

    @property
    def part_rows(self) -> tuple[int, ...]:
        """Rows of one expert in each part."""
        return tuple(p.n // self.n_expert for p in self.parts)

    @property
    def n(self) -> int:
        """Output columns of one expert (its rows over all parts)."""
        return sum(self.part_rows)

    def expert_parts(self, e: int) -> list[QWeight]:
        """Expert e's rows of each part (views, no copy)."""
        out = []
        for p, n in zip(self.parts, self.part_rows):
            out.append(QWeight(p.raw[e * n: (e + 1) * n], p.qtype, p.k, n))
        return out

    def dense(self, e: int) -> torch.Tensor:
        """Expert e's matrix as float32 `[n, k]` (gguf's dequantizer: the reference)."""
        return torch.cat([w.float_view().float() if w.qtype in FLOATS else dequantize(w) for w in self.expert_parts(e)])

    def nbytes(self) -> int:
        return sum(p.raw.shape[0] * p.raw.shape[1] for p in self.parts)
