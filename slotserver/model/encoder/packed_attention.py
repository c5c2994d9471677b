"""Bidirectional attention for sequences packed into one batch of rows, each sequence attending to itself.

The projections of an encoder run on the packed rows `[T, n]` (no padding); attention needs each
sequence's keys apart. `PackedAttention.of(lengths)` precomputes where each packed row sits in a
`[B, L]` padded grid (L: the longest sequence) and the additive mask of the padding keys;
`attend(qkv)` scatters q|k|v into the grid, computes softmax(q k^T / sqrt(hd) + mask) v with batched
matmuls, and gathers the real rows back. Padding rows compute garbage that nobody reads; no real row
ever sees a padding key, so a sequence's result does not depend on what it was batched with.

Why explicit matmuls rather than `F.scaled_dot_product_attention`: for a batch of 32 short texts
(L ~ 46, 12 heads of 32) torch's CPU SDPA with a mask took 4.2 ms a layer, these 3.0 ms (1 thread).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class PackedAttention:
    rows: torch.Tensor | None   # [T]: each packed row's index in the flat [B * L] grid; None: one sequence
    mask: torch.Tensor | None   # [B, 1, 1, L]: 0 for a real key, -inf for padding; None: no padding
    B: int
    L: int
    grid: torch.Tensor | None = None   # [B * L, 3 d]: the padded q|k|v, reused across layers
    windows: dict[int, torch.Tensor] | None = None   # half window -> its [L, L] mask (`_outside`)

    @classmethod
    def of(cls, lengths: list[int]) -> "PackedAttention":
        B, L = len(lengths), max(lengths)
        if B == 1:
            return cls(None, None, 1, L)
        keys = torch.arange(L) < torch.tensor(lengths)[:, None]                       # [B, L]
        mask = torch.zeros(B, 1, 1, L).masked_fill_(~keys[:, None, None, :], float("-inf"))
        return cls(keys.flatten().nonzero().flatten(), mask, B, L)

    def attend(self, qkv: torch.Tensor, n_heads: int, half_window: int | None = None) -> torch.Tensor:
        """qkv `[T, 3 d]` (q | k | v, heads contiguous in each) -> attention output `[T, d]`;
        half_window: each query sees only the keys at most that many positions away (ModernBERT's
        symmetric windows); None: every key of its sequence."""
        d = qkv.shape[1] // 3
        hd = d // n_heads
        grid = self._padded(qkv).view(self.B, self.L, 3, n_heads, hd)
        q, k, v = grid.permute(2, 0, 3, 1, 4).unbind(0)                               # [B, H, L, hd] each
        scores = torch.matmul(q, k.transpose(-1, -2)).mul_(hd ** -0.5)                # [B, H, L, L]
        if self.mask is not None:
            scores.add_(self.mask)
        if half_window is not None:
            scores.masked_fill_(self._outside(half_window), float("-inf"))
        out = torch.matmul(scores.softmax(-1), v)                                     # [B, H, L, hd]
        flat = out.transpose(1, 2).reshape(self.B * self.L, d)
        return flat if self.rows is None else flat[self.rows]

    def _outside(self, half_window: int) -> torch.Tensor:
        """[L, L] True where a key lies more than half_window positions from the query; built once
        per forward and window (ModernBERT's windowed layers all share one)."""
        if self.windows is None:
            self.windows = {}
        if half_window not in self.windows:
            pos = torch.arange(self.L)
            self.windows[half_window] = (pos[None, :] - pos[:, None]).abs() > half_window
        return self.windows[half_window]

    def _padded(self, x: torch.Tensor) -> torch.Tensor:
        """x scattered into the grid; the grid is zeroed once per forward and reused by every layer
        (its padding rows stay zero: a finite key that the mask then hides)."""
        if self.rows is None:
            return x
        if self.grid is None or self.grid.shape[1] != x.shape[1] or self.grid.dtype != x.dtype:
            self.grid = x.new_zeros(self.B * self.L, x.shape[1])
        self.grid[self.rows] = x
        return self.grid
