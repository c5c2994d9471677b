"""The two matmuls of a tensor-parallel layer that talk to the other ranks.

A column-parallel matmul (q|k|v, gate|up) needs no wrapper: each rank holds whole output rows
and its outputs are its own heads or FFN columns. A row-parallel one (the attention output, the
down projection) holds a slice of the input columns, so each rank's product is a partial sum:
`RowParallel` all-reduces it before anything reads it (the bias, where there is one, added once,
after the sum). The output head holds a slice of the vocabulary: `VocabParallel` gathers the
logits on rank 0, so its sampler sees the whole row.

Both take `(x, ops)` like `Linear` and `QLinear`, so `LlamaModel` calls them through its unfused
path (they are neither): the residual add then happens after the sum, on every rank alike.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from slotserver.parallel.comm import Comm


@dataclass
class RowParallel:
    lin: object                        # Linear | QLinear: [d_out, this rank's columns]
    comm: Comm
    bias: torch.Tensor | None = None   # [d_out], added after the all-reduce

    @property
    def out_features(self) -> int:
        return self.lin.out_features

    def __call__(self, x: torch.Tensor, ops) -> torch.Tensor:
        """x [rows, this rank's columns] -> the summed [rows, d_out] (the same on every rank)."""
        y = self.comm.all_reduce(self.lin(x, ops))
        return y if self.bias is None else y + self.bias.to(y.dtype)

    def nbytes(self) -> int:
        return self.lin.nbytes()


@dataclass
class VocabParallel:
    lin: object          # [this rank's vocabulary rows, d_model]
    comm: Comm
    widths: list[int]    # every rank's row count, in rank order (they sum to the vocabulary)

    @property
    def out_features(self) -> int:
        return sum(self.widths)

    def __call__(self, x: torch.Tensor, ops) -> torch.Tensor:
        """x [rows, d_model] -> float32 logits [rows, vocab] on rank 0 (the others: their slice)."""
        return self.comm.gather_columns(self.lin(x, ops), self.widths)

    def nbytes(self) -> int:
        return self.lin.nbytes()
