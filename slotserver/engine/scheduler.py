"""The scheduler: pure Python, no tensors. `schedule()` returns a plain `StepPlan`;
`postprocess()` applies the sampled tokens.

Per step: admit waiting requests into slots (strict FIFO), defragment the stream map, then fill
the token budget: every decoding sequence's next token first, then prefill chunks, oldest request
first. A sequence that is not scheduled keeps its counters and is picked up next step, so nothing
starves: decodes always run, and the oldest prefill always gets the budget left.

With a paged KV layout the engine passes a capacity callback returning a `KVBudget`
(slotserver/runtime/paged_contract.py, owned by the KV side: the only place cells become blocks). The
scheduler speaks in cells: it asks the budget whether streams holding so many cells fit the pool
(`fits`) and how many cells a sequence may hold soon (`reserve`: its tokens plus decode headroom,
at most a full slot). Two more rules then hold (with a flat layout the callback gives None: no change):
- admission: the head of the queue gets a slot only if its reservation fits next to every running
  sequence's reservation and the idle slots' prompt caches; idle caches (least recently used
  first) are evicted to make room, else the head waits (FIFO).
- decode never runs out: before admitting, if the running sequences' tokens no longer fit, idle
  caches are evicted, then the running sequence with the least progress (fewest computed cells,
  youngest on ties) is preempted: its blocks are freed and it goes back to the queue in arrival
  order, to be prefilled again (prompt + generated tokens) and continue where it stopped.
Freed blocks are `StepPlan.trims` (stream, cells kept), applied by the engine before the moves.

KV shifts (`StepPlan.shifts`, applied first): with --context-shift a generating sequence whose
slot is full drops tokens at the start of the step (engine/context_shift.py); with --cache-reuse
an admission moves cached chunks into place (engine/cache_reuse.py).

Several choices of one prompt (`n` > 1, as llama-server's child tasks): the first sequence
prefills the prompt; each sibling (its `parent` is that first one) takes a slot but waits while the
parent is prefilling, then gets the parent's prompt KV (`StepPlan.forks`: a stream copy for
contiguous layouts, shared blocks with copy-on-write for paged ones) and computes only the last
prompt token. If the parent is gone before that (finished, cancelled, preempted), the sibling
prefills on its own: same tokens, only slower.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable

from slotserver.engine import cache_reuse
from slotserver.engine.config import EngineConfig
from slotserver.engine.context_shift import ContextShift, KVShift
from slotserver.engine.sequence import Sequence
from slotserver.engine.slots import SlotTable
from slotserver.engine.stream_map import Move, StreamMap
from slotserver.runtime.paged_contract import KVBudget  # also imported from here: the budget `Scheduler` receives


CHECKPOINT_BEFORE_END = 4   # llama-server's last checkpoint of a prompt: 4 tokens before its end


@dataclass(frozen=True)
class ScheduledChunk:
    seq: Sequence
    stream: int
    start: int       # = seq.num_computed when planned
    n: int           # tokens of this step
    sample: bool     # the chunk reaches the end of the sequence: sample its next token
    draft: tuple[int, ...] = ()   # speculative tokens after the chunk's, verified from their logits rows
    checkpoint: bool = False      # a hybrid model: snapshot the stream's state after it (runtime/recurrent_state.py)


@dataclass
class StepPlan:
    chunks: list[ScheduledChunk] = field(default_factory=list)
    moves: list[Move] = field(default_factory=list)
    admitted: list[Sequence] = field(default_factory=list)
    trims: list[tuple[int, int]] = field(default_factory=list)  # (stream, cells kept), before moves
    preempted: list[Sequence] = field(default_factory=list)
    forks: list[Move] = field(default_factory=list)   # prompt KV copied to a sibling, after the moves
    shifts: list[KVShift] = field(default_factory=list)  # context shift / cache reuse, before the trims

    @property
    def n_tokens(self) -> int:
        return sum(c.n for c in self.chunks)


class Scheduler:
    def __init__(self, config: EngineConfig, budget: Callable[[], KVBudget | None] | None = None,
                 hooks=None, add_bos: bool = False, recurrent: Callable[[int], list[int]] | None = None) -> None:
        self.config = config
        # a hybrid model (engine/recurrent_policy.py): recurrent(stream) -> the positions its state can
        # be put back to (where it stands, its checkpoints); a slot's cache serves up to one of them,
        # and n > 1 siblings compute their prompts themselves (a state cannot be cut back to a prefix)
        self.recurrent = recurrent
        # --context-shift: a full slot's sequence drops tokens (engine/context_shift.py); add_bos: n_keep + 1
        self.shift = ContextShift(config.n_cells, add_bos) if config.context_shift else None
        # --cache-ram (engine/prompt_cache.py): on_select(slot, seq) may put a longer cached prefix in
        # the slot before its reuse is counted; on_admitted() runs once a request took its slot
        self.hooks = hooks
        self.budget = budget or (lambda: None)  # asked every step: a layout swap may change it
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
        plan, budget = StepPlan(), self.budget()
        if self.shift is not None:   # before the budget: a shifted sequence holds fewer cells
            plan.shifts = self.shift.shift_full(self.running(), self.streams.stream_of)
        if budget is not None:
            self._make_room(budget, plan)
        plan.admitted = self._admit(budget, plan)
        if self.config.defrag == "on":
            plan.moves = self.streams.plan_defrag(self.slots.slots)
        waiting = self._fork_siblings(plan)
        plan.chunks = self._fill_budget(waiting)
        self.check_invariants()
        return plan

    def _admit(self, budget: KVBudget | None, plan: StepPlan) -> list[Sequence]:
        admitted = []
        while self.waiting:
            seq = self.waiting[0]
            if self.hooks is not None and self.hooks.holds_back(seq, self.running()):
                break  # a running prefill is computing this prompt's prefix: take a copy once it is done
            slot = self.slots.select(tuple(seq.tokens[: seq.num_prompt]), seq.request.id_slot, seq.cache_ns)
            if slot is None or (budget is not None and not self._fits(budget, seq, slot, plan)):
                break  # strict FIFO: the head waits, and so does everyone behind it
            self.waiting.popleft()
            if self.hooks is not None:
                self.hooks.on_select(slot, seq)
            n_min = cache_reuse.min_chunk(seq, self.config)
            stream = self.streams.stream_of[slot.id]
            reuse, shift = cache_reuse.reuse(slot.cached_for(seq.cache_ns), seq, n_min, stream)
            plan.shifts += [shift] if shift is not None else []   # --cache-reuse: chunks moved into place
            # logits need >= 1 token (num_tokens: a preempted sequence that a context shift shortened)
            seq.num_computed = seq.num_cached = min(reuse, seq.num_prompt - 1, seq.num_tokens - 1)
            if self.recurrent is not None:   # the shared prefix, cut back to where a state can resume
                fits = [n for n in self.recurrent(stream) if n <= seq.num_computed]
                seq.num_computed = seq.num_cached = max(fits, default=0)
            # the slot's cached cells past the reused prefix: paged, their blocks go back; a hybrid
            # model's state is put back there (its live state, a checkpoint or 0: KVCache.trim)
            if budget is not None or self.recurrent is not None:
                plan.trims.append((stream, seq.num_computed))
            slot.occupy(seq)
            seq.t_start = time.perf_counter()
            admitted.append(seq)
            if self.hooks is not None:
                self.hooks.on_admitted()
        return admitted

    # -- paged KV: admission by free blocks, room for decodes (the budget is asked in cells) ----
    def _fits(self, budget: KVBudget, seq: Sequence, slot, plan: StepPlan) -> bool:
        """Can `seq` take `slot` within the pool? Evicts idle caches (LRU first) if that makes it fit."""
        soon = [budget.reserve(s.num_tokens, self.config.n_cells) for s in (*self.running(), seq)]
        if not budget.fits(soon):
            return False  # even with every idle cache gone: evict nothing, the head waits
        others = sorted((s for s in self.slots.idle() if s is not slot and s.cached), key=lambda s: s.last_used)
        while not budget.fits(soon + [len(s.cached) for s in others]):
            self._evict(others.pop(0), plan)
        return True

    def _make_room(self, budget: KVBudget, plan: StepPlan) -> None:
        """Every running sequence's tokens must fit this step: evict idle caches, then preempt."""
        while not budget.fits(self.held_cells()):
            idle = sorted((s for s in self.slots.idle() if s.cached), key=lambda s: s.last_used)
            if idle:
                self._evict(idle[0], plan)
                continue
            victim = min(self.running(), key=lambda s: (s.num_computed, -s.arrival))
            self._preempt(victim, plan)

    def held_cells(self) -> list[int]:
        """Cells each slot holds now: a running sequence's tokens (up to a full slot), else its cache."""
        return [min(s.seq.num_tokens, self.config.n_cells) if s.seq else len(s.cached) for s in self.slots.slots]

    def _evict(self, slot, plan: StepPlan) -> None:
        plan.trims.append((self.streams.stream_of[slot.id], 0))
        slot.cached = []

    def _preempt(self, seq: Sequence, plan: StepPlan) -> None:
        """Free the sequence's blocks and queue it again in arrival order; it keeps its tokens."""
        slot = self.slots.slots[seq.slot_id]
        plan.trims.append((self.streams.stream_of[slot.id], 0))
        slot.seq, slot.cached = None, []
        seq.slot_id, seq.num_computed, seq.num_cached = -1, 0, 0
        later = [i for i, w in enumerate(self.waiting) if w.arrival > seq.arrival]
        self.waiting.insert(later[0] if later else len(self.waiting), seq)
        plan.preempted.append(seq)

    def _fork_siblings(self, plan: StepPlan) -> set[int]:
        """Copy a prefilled parent's prompt KV to its siblings; -> ids of siblings still waiting."""
        waiting = set()
        for seq in self.running():
            parent = seq.parent
            if parent is None:
                continue
            if self.recurrent is not None:   # the parent's state stands past the prompt's last token: prefill alone
                seq.parent = None
                continue
            target = seq.num_prompt - 1                       # the last prompt token is computed for logits
            if parent.finished or parent.slot_id < 0 or seq.num_computed >= target:
                seq.parent = None                             # prefill alone (or nothing left to share)
            elif parent.num_computed < target:
                waiting.add(seq.id)                           # the parent is still prefilling
            else:
                src, dst = self.streams.stream_of[parent.slot_id], self.streams.stream_of[seq.slot_id]
                plan.forks.append(Move(src, dst, target))
                seq.num_computed = seq.num_cached = target
                seq.parent = None
        return waiting

    def _fill_budget(self, waiting: set[int] = frozenset()) -> list[ScheduledChunk]:
        budget = self.config.step_tokens
        running = sorted((s for s in self.running() if s.id not in waiting), key=lambda s: s.arrival)
        chunks = []
        for seq in running:  # decodes first: one token each
            if seq.num_pending == 1 and budget > 0:
                chunks.append(self._chunk(seq, 1))
                budget -= 1
        for seq in running:  # then prefill, oldest first
            if seq.num_pending > 1 and budget > 0:
                n, mark = min(seq.num_pending, budget), self._checkpoint_at(seq)
                if seq.num_computed < mark < seq.num_computed + n:
                    n = mark - seq.num_computed   # a hybrid model's checkpoint: the chunk ends there
                chunks.append(self._chunk(seq, n, seq.num_computed + n == mark))
                budget -= n
        # Decodes first, then prefill chunks (`AttnMeta.split` runs the two groups apart; a decode
        # row after a prefill chunk would be padded to the chunk's length), each group in stream
        # order: contiguous streams are sliced, not gathered.
        return sorted(chunks, key=lambda c: (c.n > 1, c.stream))

    def _chunk(self, seq: Sequence, n: int, checkpoint: bool = False) -> ScheduledChunk:
        stream = self.streams.stream_of[seq.slot_id]
        return ScheduledChunk(seq, stream, seq.num_computed, n, seq.num_computed + n == seq.num_tokens,
                              checkpoint=checkpoint)

    def _checkpoint_at(self, seq: Sequence) -> int:
        """Where a hybrid model's prompt gets a state checkpoint (--ctx-checkpoints > 0): CHECKPOINT_BEFORE_END
        tokens before its end, as llama-server's last one (a next turn or the same prompt again shares
        all but the end); -1: none."""
        if self.recurrent is None or self.config.ctx_checkpoints <= 0:
            return -1
        return seq.num_prompt - CHECKPOINT_BEFORE_END

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
