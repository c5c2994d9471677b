"""The token masks of one step's constrained rows, computed while the forward runs.

`MaskFiller.start(matchers)` takes the sampled rows' matchers (None for a free row) in plan order
and hands llguidance's executor the constrained ones on a helper thread; `result()` (after the
forward) returns the allowed-token mask `[rows, vocab]` (bool; free rows all True) or None when
no row is constrained. llguidance releases the GIL and fills masks in its own threads (Rust, not
OpenMP: torch's thread team is untouched), so the masks cost the step nothing beyond the forward
unless they take longer than it. Matchers are only advanced in postprocess, after `result()`, so
the helper never sees one change under it.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from typing import Sequence

import torch

from slotserver.engine.grammar import Grammars

_BIT = torch.arange(32, dtype=torch.int32)


def unpack_bitmask(bitmask: torch.Tensor, vocab: int) -> torch.Tensor:
    """llguidance's int32 bitmask [rows, ceil(vocab/32)] (bit j of word w: token 32w+j) -> bool [rows, vocab]."""
    bits = (bitmask.unsqueeze(2) >> _BIT) & 1                     # [rows, words, 32]
    return bits.reshape(bitmask.shape[0], -1)[:, :vocab].bool()    # [rows, vocab]


class PendingMasks:
    """The masks of one step, being filled; `result()` waits for them."""

    def __init__(self, future: Future | None, bitmask: torch.Tensor | None, vocab: int) -> None:
        self._future, self._bitmask, self._vocab = future, bitmask, vocab

    def result(self) -> torch.Tensor | None:
        if self._future is None:
            return None
        self._future.result()   # re-raises an executor failure on the engine thread
        return unpack_bitmask(self._bitmask, self._vocab)


class MaskFiller:
    def __init__(self, grammars: Grammars) -> None:
        self.grammars = grammars
        self._pool: ThreadPoolExecutor | None = None

    def start(self, matchers: Sequence[object | None]) -> PendingMasks:
        rows = [(m, i) for i, m in enumerate(matchers) if m is not None]
        vocab = self.grammars.vocab_size
        if not rows:
            return PendingMasks(None, None, vocab)
        words = (vocab + 31) // 32
        bitmask = torch.full((len(matchers), words), -1, dtype=torch.int32)   # free rows: every bit set
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="slotserver-masks")
        executor = self.grammars.executor
        future = self._pool.submit(executor.unsafe_compute_mask_ptr, rows, bitmask.data_ptr(), words * 4,
                                   len(matchers))
        return PendingMasks(future, bitmask, vocab)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False)
