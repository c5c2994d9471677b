"""The paged KV contract: what a paged layout object provides on top of the layout contract, and
the block arithmetic the scheduler leaves to the KV side.

A layout is paged when its `view(layer)` is a `PagedKV` (`view.paged`). Then its cells live in
blocks of `block_size` cells taken from a pool of at most `max_blocks`, and the engine gives blocks
back with `trim_stream(stream, n)` (keep the first n cells) and `free_stream(stream)` (keep none,
e.g. a defrag move's source). `PagedLayout` states that as a Protocol; `create_layout`
(slotserver/runtime/layouts.py) refuses a paged layout missing any of it, so a lab edit that drops a
method fails at load time with its name rather than as a leak later.

`KVBudget` is the pool's capacity in plain numbers. The scheduler receives one every step and asks
it in cells (`fits`, `reserve`); only this class turns cells into blocks. No torch here: the
scheduler imports this module and must stay torch-free.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Protocol, runtime_checkable


@runtime_checkable
class PagedLayout(Protocol):
    """A layout object whose view is paged (besides write, view, copy_stream, ...)."""

    block_size: int   # cells per block
    max_blocks: int   # the pool's limit: blocks all streams together may hold

    def trim_stream(self, stream: int, n: int) -> None:
        """Keep the blocks holding the stream's first `n` cells; the others go back to the pool."""

    def free_stream(self, stream: int) -> None:
        """Give back all of the stream's blocks (blocks shared with another stream stay with it)."""


PAGED_ATTRS = tuple(PagedLayout.__annotations__)
PAGED_METHODS = tuple(n for n, v in vars(PagedLayout).items() if callable(v) and not n.startswith("_"))


def is_paged(layout) -> bool:
    """Whether the layout hands out paged views: the one test the loader and the KV cache share."""
    return bool(getattr(layout.view(0), "paged", False))


def paged_missing(layout) -> list[str]:
    """The members of `PagedLayout` the object lacks (an int attribute, or a callable method)."""
    missing = [a for a in PAGED_ATTRS if not isinstance(getattr(layout, a, None), int)]
    return missing + [m for m in PAGED_METHODS if not callable(getattr(layout, m, None))]


@dataclass(frozen=True)
class KVBudget:
    """A paged KV pool's capacity, queried in cells: a stream holding n cells costs
    ceil(n / block_size) blocks, and streams fit while their blocks total at most `max_blocks`."""

    block_size: int
    max_blocks: int
    headroom: int = 1   # decode blocks reserved per sequence at admission

    @classmethod
    def of(cls, layout: PagedLayout) -> "KVBudget":
        return cls(layout.block_size, layout.max_blocks)

    def blocks_for(self, n_cells: int) -> int:
        return -(-n_cells // self.block_size)

    def reserve(self, n_tokens: int, limit: int) -> int:
        """Cells a sequence of `n_tokens` may hold soon: its tokens plus `headroom` decode blocks,
        at most `limit` (a full stream), so admission leaves every admitted request room to decode."""
        return min(n_tokens + self.headroom * self.block_size, limit)

    def fits(self, cells: Iterable[int]) -> bool:
        """Whether streams holding these many cells each fit in the pool together."""
        return sum(self.blocks_for(n) for n in cells) <= self.max_blocks
