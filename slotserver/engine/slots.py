"""llama-server's slots: which idle slot a new request takes.

Selection, as in llama-server: the slot named by `id_slot`; else the idle slot whose cached tokens
share the longest common prefix with the prompt, if that prefix is more than
`slot_prompt_similarity` of the prompt; else the least recently used idle slot.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from slotserver.engine.sequence import Sequence

_clock = itertools.count(1)


@dataclass
class Slot:
    id: int
    cached: list[int] = field(default_factory=list)   # tokens whose KV is in the slot's stream
    seq: Sequence | None = None
    last_used: int = 0
    ns: str = ""   # the adapters its KV was computed under (Sequence.cache_ns; "": the base model)

    @property
    def idle(self) -> bool:
        return self.seq is None

    @property
    def n_valid(self) -> int:
        """Cells of the stream that hold valid KV (what a defrag move must copy)."""
        return self.seq.num_computed if self.seq is not None else len(self.cached)

    def cached_for(self, ns: str) -> list[int]:
        """The cached tokens whose KV serves a request computing under adapters `ns`: all of them, or
        none when they were computed under other adapters."""
        return self.cached if self.ns == ns else []

    def valid_tokens(self) -> list[int]:
        """The tokens whose KV the stream holds: the cache of an idle slot, a busy one's computed tokens."""
        return self.cached if self.seq is None else self.seq.tokens[: self.seq.num_computed]

    def occupy(self, seq: Sequence) -> None:
        assert self.idle, f"slot {self.id} is busy"
        self.seq, seq.slot_id, self.last_used = seq, self.id, next(_clock)
        if self.ns != seq.cache_ns:   # KV of other adapters: none of it serves this request's tokens
            self.cached, self.ns = [], seq.cache_ns

    def release(self) -> None:
        """The request is done: keep what it computed as this slot's prompt cache."""
        assert self.seq is not None
        self.cached, self.seq, self.last_used = self.seq.computed_tokens, None, next(_clock)


SHORT_PREFIX = 64   # common_prefix: below this many tokens, a plain loop


def common_prefix(a: list[int] | tuple[int, ...], b: list[int] | tuple[int, ...]) -> int:
    """Length of the longest common prefix. From SHORT_PREFIX tokens on, by comparing slices (C
    loops) and halving the span that differs rather than a Python loop per token: admission runs
    this over every slot (and ran it over every RAM-cache entry, 19% of the engine thread at 64
    streams with 640 entries, py-spy, before prefix_index), and prompts that share a long system
    prompt pay per shared token. Per entry sharing 300 / 3000 tokens: 5.2 / 37 us against 9.9 / 97
    us; below ~64 tokens the plain loop is as quick (30 shared: 1.2 us either way)."""
    n = min(len(a), len(b))
    if n < SHORT_PREFIX:
        i = 0
        while i < n and a[i] == b[i]:
            i += 1
        return i
    if a[0] != b[0]:
        return 0
    if type(a) is not type(b):   # a list never equals a tuple
        a, b = tuple(a[:n]), tuple(b[:n])
    if a[:n] == b[:n]:
        return n
    lo, hi = 1, n   # a[:lo] == b[:lo], a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid
    return lo


class SlotTable:
    def __init__(self, n_slots: int, similarity: float) -> None:
        self.slots = [Slot(i) for i in range(n_slots)]
        self.similarity = similarity

    def idle(self) -> list[Slot]:
        return [s for s in self.slots if s.idle]

    def active(self) -> list[Slot]:
        return [s for s in self.slots if not s.idle]

    def select(self, prompt: tuple[int, ...], id_slot: int, ns: str = "") -> Slot | None:
        """The slot for a request, or None if it must wait. Only a slot whose KV was computed under
        the request's adapters (`ns`) counts as sharing its prefix."""
        if id_slot >= 0:
            slot = self.slots[id_slot]
            return slot if slot.idle else None
        idle = self.idle()
        if not idle:
            return None
        if self.similarity > 0 and prompt:
            best = max(idle, key=lambda s: (common_prefix(s.cached_for(ns), prompt), -s.last_used))
            if common_prefix(best.cached_for(ns), prompt) / len(prompt) > self.similarity:
                return best
        return min(idle, key=lambda s: s.last_used)
