"""The scheduler: pure Python, no tensors. `schedule()` returns a plain `StepPlan`;
`postprocess()` applies the sampled tokens.

Per step: admit waiting requests into slots (strict FIFO), defragment the stream map, then fill
the token budget: every decoding sequence's next token first, then prefill chunks, oldest request
first. A sequence that is not scheduled keeps its counters and is picked up next step, so nothing
starves: decodes always run, and the oldest prefill always gets the budget left.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

from slotserver.engine_config import EngineConfig
from slotserver.sequence import Sequence
from slotserver.slots import SlotTable, common_prefix
from slotserver.stream_map import Move, StreamMap


@dataclass(frozen=True)
class ScheduledChunk:
    seq: Sequence
    stream: int
    start: int       # = seq.num_computed when planned
    n: int           # tokens of this step
    sample: bool     # the chunk reaches the end of the sequence: sample its next token


@dataclass
class StepPlan:
    chunks: list[ScheduledChunk] = field(default_factory=list)
    moves: list[Move] = field(default_factory=list)
    admitted: list[Sequence] = field(default_factory=list)

    @property
    def n_tokens(self) -> int:
        return sum(c.n for c in self.chunks)


class Scheduler:
    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.slots = SlotTable(config.n_parallel, config.slot_prompt_similarity)
        self.streams = StreamMap(config.n_parallel, config.n_streams)
        self.waiting: deque[Sequence] = deque()

    # -- verbs used by the engine --------------------------------------------------------------
    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def running(self) -> list[Sequence]:
        return [s.seq for s in self.slots.slots if s.seq is not None]

    def has_work(self) -> bool:
        return bool(self.waiting) or any(not s.idle for s in self.slots.slots)

    def finish(self, seq: Sequence) -> None:
        """Free the sequence's slot (it keeps the computed tokens as its prompt cache)."""
        if seq.finished:
            return
        seq.finished = True
        if seq.slot_id >= 0:
            self.slots.slots[seq.slot_id].release()
        else:
            self.waiting.remove(seq)

    # -- one step --------------------------------------------------------------------------------
    def schedule(self) -> StepPlan:
        plan = StepPlan(admitted=self._admit())
        if self.config.defrag == "on":
            plan.moves = self.streams.plan_defrag(self.slots.slots)
        plan.chunks = self._fill_budget()
        self.check_invariants()
        return plan

    def _admit(self) -> list[Sequence]:
        admitted = []
        while self.waiting:
            seq = self.waiting[0]
            slot = self.slots.select(tuple(seq.tokens[: seq.num_prompt]), seq.request.id_slot)
            if slot is None:
                break  # strict FIFO: the head waits, and so does everyone behind it
            self.waiting.popleft()
            reuse = common_prefix(slot.cached, seq.tokens) if seq.request.cache_prompt else 0
            seq.num_computed = seq.num_cached = min(reuse, seq.num_prompt - 1)  # logits need >= 1 token
            slot.occupy(seq)
            seq.t_start = time.perf_counter()
            admitted.append(seq)
        return admitted

    def _fill_budget(self) -> list[ScheduledChunk]:
        budget = self.config.step_tokens
        running = sorted(self.running(), key=lambda s: s.arrival)
        chunks = []
        for seq in running:  # decodes first: one token each
            if seq.num_pending == 1 and budget > 0:
                chunks.append(self._chunk(seq, 1))
                budget -= 1
        for seq in running:  # then prefill, oldest first
            if seq.num_pending > 1 and budget > 0:
                n = min(seq.num_pending, budget)
                chunks.append(self._chunk(seq, n))
                budget -= n
        # Decodes first, then prefill chunks (`AttnMeta.split` runs the two groups apart; a decode
        # row after a prefill chunk would be padded to the chunk's length), each group in stream
        # order: contiguous streams are sliced, not gathered.
        return sorted(chunks, key=lambda c: (c.n > 1, c.stream))

    def _chunk(self, seq: Sequence, n: int) -> ScheduledChunk:
        stream = self.streams.stream_of[seq.slot_id]
        return ScheduledChunk(seq, stream, seq.num_computed, n, seq.num_computed + n == seq.num_tokens)

    def check_invariants(self) -> None:
        """No slot or stream leak, one sequence per slot and stream; packed streams with defrag on."""
        running = self.running()
        assert len({s.id for s in running}) == len(running)
        for slot in self.slots.slots:
            assert slot.seq is None or slot.seq.slot_id == slot.id
        self.streams._check()
        if self.config.defrag == "on":
            assert self.streams.is_packed(self.slots.slots), "active streams are not contiguous"
        assert all(s.slot_id == -1 for s in self.waiting)
