"""`SplitNorm`: an RMSNorm over a vector whose columns are split across the ranks.

olmoe normalizes q over all of its heads at once (and k over all KV heads: `qk_norm_full`), not
head by head, so under --tp a rank holding some heads does not hold the whole vector the mean of
squares runs over. Each rank sums the squares of its own columns, one all-reduce ([rows, 1],
float32) makes the whole sum on every rank, and each scales its columns by its slice of the norm
weight: the same RMSNorm up to the order of the sum (vLLM gathers all of q instead; a row's one
float is less to send). Per-head norms (qwen3, gemma3) need nothing: a rank holds whole heads.

Called like the weight it replaces, through attention_branch.py's `_full_norm`: (x, ops, eps).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from slotserver.parallel.comm import Comm


@dataclass
class SplitNorm:
    weight: torch.Tensor   # [this rank's columns] of the norm weight
    comm: Comm
    width: int             # the whole vector's columns (over every rank)

    def __call__(self, x: torch.Tensor, ops, eps: float) -> torch.Tensor:
        """x [rows, this rank's columns] -> RMSNorm'd over all ranks' columns, in x's dtype."""
        xf = x.float()
        squares = self.comm.all_reduce(xf.pow(2).sum(dim=-1, keepdim=True).contiguous())   # [rows, 1]
        return (xf * torch.rsqrt(squares / self.width + eps) * self.weight.float()).to(x.dtype)
