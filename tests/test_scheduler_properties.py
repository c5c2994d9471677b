"""Property-based tests of slots, scheduler and defrag, with a fake KV cache that records which
token sits in which cell: over random arrivals, finishes and cancels, no slot or stream leaks,
never two sequences on one stream, active streams contiguous after every schedule with defrag on,
FIFO queue order kept, one-token chunks ahead of longer ones (so attention splits a mixed
step instead of padding decode rows), and every sequence's stream always holds exactly its computed tokens
(so defrag moves and prompt-cache reuse never corrupt a KV); with a paged pool's budget, the
blocks held never exceed it, and preempted requests still finish. The budget is the only block
arithmetic: the scheduler asks it in cells, so a pool with no blocks at all works too."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from slotserver.model.text.detokenizer import IncrementalDetokenizer
from slotserver.engine.config import EngineConfig
from slotserver.engine.postprocess import Sampled, postprocess
from slotserver.engine.request import Request, RequestHandle
from slotserver.model.sampling.sampler import SamplingParams, SequenceRng
from slotserver.engine.scheduler import KVBudget, Scheduler
from slotserver.engine.sequence import Sequence
from slotserver.engine.stop_strings import StopMatcher

EOG = frozenset({0})


class FakeCache:
    """Token ids instead of K/V: cell (stream, pos) holds the token whose KV would be there.

    `paged`: like a paged layout under the engine, trims drop cells past the kept ones, a move's
    destination holds only the copied cells and its source is freed."""

    def __init__(self, n_streams: int, n_cells: int, paged: bool = False) -> None:
        self.n_cells, self.paged = n_cells, paged
        self.cells = [[None] * n_cells for _ in range(n_streams)]

    def shift(self, shifts) -> None:
        """KV shifts (context shift, cache reuse): each span's cells move down (the engine also
        re-rotates K; here the tokens just move), then a paged stream keeps only `keep` cells."""
        for s in shifts:
            cells = self.cells[s.stream]
            for span in s.spans:
                cells[span.dst: span.dst + span.n] = cells[span.src: span.src + span.n]
            if self.paged:
                cells[s.keep:] = [None] * (self.n_cells - s.keep)

    def apply(self, moves, trims=()) -> None:
        for stream, n in trims:
            self.cells[stream][n:] = [None] * (self.n_cells - n)
        for m in moves:
            if self.paged:
                self.cells[m.dst] = self.cells[m.src][: m.n_cells] + [None] * (self.n_cells - m.n_cells)
                self.cells[m.src] = [None] * self.n_cells
            else:
                self.cells[m.dst][: m.n_cells] = self.cells[m.src][: m.n_cells]

    def blocks_held(self, block_size: int) -> int:
        """Blocks a paged pool holds: each stream up to its last cell in use."""
        held = [max((i + 1 for i, t in enumerate(c) if t is not None), default=0) for c in self.cells]
        return sum(-(-n // block_size) for n in held)


def make_machine(defrag: str, tokenizer, budget: KVBudget | None = None, max_predict: int = 8, **engine):
    class SchedulerMachine(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.config = EngineConfig(n_parallel=4, ctx_size=4 * 24, ubatch_size=16, batch_size=16,
                                       defrag=defrag, queue_limit=100, **engine)
            self.sched = Scheduler(self.config, budget=lambda: budget)
            self.cache = FakeCache(self.config.n_streams, self.config.n_cells, paged=budget is not None)
            self.next_id, self.admit_order, self.submit_order = 1, [], []

        @rule(prompt=st.lists(st.integers(1, 5), min_size=1, max_size=12),
              n_predict=st.integers(1, max_predict), pin=st.integers(-3, 3), keep=st.integers(-1, 4),
              discard=st.integers(0, 6))
        def submit(self, prompt, n_predict, pin, keep, discard):
            req = Request(tuple(prompt), SamplingParams(temperature=0), n_predict=n_predict, id_slot=max(pin, -1),
                          n_keep=keep, n_discard=discard)   # n_keep, n_discard: context shift only
            handle = RequestHandle(self.next_id, req, engine=None)
            self.next_id += 1
            seq = Sequence(handle, list(prompt), len(prompt), SequenceRng(1), req.params,
                           IncrementalDetokenizer(tokenizer), StopMatcher(()))
            self.sched.add(seq)
            self.submit_order.append(seq.id)

        @rule(data=st.data())
        def step(self, data):
            plan = self.sched.schedule()
            self.admit_order += [s.id for s in plan.admitted]  # schedule() asserts its invariants
            self.cache.shift(plan.shifts)   # before the trims and moves, as Engine._apply_moves
            self.cache.apply(plan.moves, plan.trims)
            streams = [c.stream for c in plan.chunks]
            assert len(set(streams)) == len(streams), "two sequences on one stream in a step"
            order = [(c.n > 1, c.stream) for c in plan.chunks]
            assert order == sorted(order), "one-token chunks must lead, each group in stream order"
            for c in plan.chunks:
                assert self.cache.cells[c.stream][: c.start] == c.seq.tokens[: c.start], "KV lost or corrupted"
                self.cache.cells[c.stream][c.start: c.start + c.n] = c.seq.tokens[c.start: c.start + c.n]
            if budget is not None:
                assert self.cache.blocks_held(budget.block_size) <= budget.max_blocks, "KV pool overrun"
            n_sample = sum(c.sample for c in plan.chunks)
            tokens = data.draw(st.lists(st.integers(0, 5), min_size=n_sample, max_size=n_sample))
            postprocess(self.sched, plan, [(Sampled(t),) for t in tokens], EOG)

        @rule(data=st.data())
        def drain(self, data):
            """Liveness: with no new arrivals, every request finishes within a bounded number of steps."""
            for _ in range(200):
                if not self.sched.has_work():
                    return
                self.step(data)
            raise AssertionError("requests starved: still working after 200 steps")

        @precondition(lambda self: self.sched.running() or self.sched.waiting)
        @rule(data=st.data())
        def cancel(self, data):
            seqs = list(self.sched.waiting) + self.sched.running()
            self.sched.finish(data.draw(st.sampled_from(seqs)))

        @invariant()
        def no_leaks(self):
            running = self.sched.running()
            assert len(running) + len(self.sched.slots.idle()) == self.config.n_parallel
            assert len(set(self.sched.streams.stream_of.values())) == self.config.n_parallel
            assert all(not s.finished for s in running)

        @invariant()
        def fifo(self):
            if budget is None:  # with a budget, a preempted request is admitted a second time
                positions = [self.submit_order.index(i) for i in self.admit_order]
                assert positions == sorted(positions), "requests admitted out of order"
            waiting = [s.id for s in self.sched.waiting]
            assert waiting == sorted(waiting)

    return SchedulerMachine


@pytest.mark.parametrize("defrag", ["on", "off"])
def test_scheduler_state_machine(defrag, tokenizer):
    machine = make_machine(defrag, tokenizer)
    machine.TestCase.settings = settings(max_examples=60, stateful_step_count=60, deadline=None,
                                         suppress_health_check=[HealthCheck.too_slow])
    machine.TestCase().runTest()


@pytest.mark.parametrize("defrag", ["on", "off"])
def test_scheduler_state_machine_with_a_small_paged_pool(defrag, tokenizer):
    """6 blocks of 4 cells = one full slot of 24, no decode headroom (so decodes often outgrow the
    pool): requests wait for blocks, the least advanced sequence is preempted, the pool is never
    overrun, no KV is corrupted and every request still finishes (`drain`)."""
    machine = make_machine(defrag, tokenizer, KVBudget(block_size=4, max_blocks=6, headroom=0))
    machine.TestCase.settings = settings(max_examples=60, stateful_step_count=60, deadline=None,
                                         suppress_health_check=[HealthCheck.too_slow])
    machine.TestCase().runTest()


@pytest.mark.parametrize("budget", [None, KVBudget(block_size=4, max_blocks=6, headroom=0)])
@pytest.mark.parametrize("defrag", ["on", "off"])
def test_scheduler_state_machine_with_context_shift_and_cache_reuse(defrag, budget, tokenizer):
    """Generations past the 24-cell slots (context shift) and prompts reusing cached chunks of >= 2
    tokens: every stream still holds exactly its sequence's tokens, n_predict is honoured (drain)."""
    machine = make_machine(defrag, tokenizer, budget, max_predict=40, context_shift=True, cache_reuse=2)
    machine.TestCase.settings = settings(max_examples=40, stateful_step_count=60, deadline=None,
                                         suppress_health_check=[HealthCheck.too_slow])
    machine.TestCase().runTest()


def test_defrag_packs_scattered_slots_and_keeps_idle_caches():
    """5 active of 16 slots scattered like 1, 10, 12, 13, 15 end up on streams 0..4; each idle
    slot that was in the way keeps its cache on another stream."""
    from slotserver.engine.slots import SlotTable
    from slotserver.engine.stream_map import StreamMap

    table, smap = SlotTable(16, 0.1), StreamMap(16, 17)
    active = {1, 10, 12, 13, 15}
    for slot in table.slots:
        slot.cached = [slot.id] * (slot.id + 1)
        if slot.id in active:
            slot.seq = type("S", (), {"num_computed": 3})()
    cells = {s: [s] * (s + 1) for s in range(16)}  # fake stream contents
    cells[16] = []
    moves = smap.plan_defrag(table.slots)
    for m in moves:
        cells[m.dst] = list(cells[m.src][: m.n_cells])
    assert sorted(smap.stream_of[s] for s in active) == [0, 1, 2, 3, 4]
    for slot in table.slots:
        if slot.id not in active:
            assert cells[smap.stream_of[slot.id]][: len(slot.cached)] == slot.cached
    assert smap.plan_defrag(table.slots) == [], "already packed: no moves"


def test_kv_budget_turns_cells_into_blocks():
    """4-cell blocks, a pool of 6: a partly used block counts whole, and a reservation adds
    `headroom` blocks of cells, at most a full stream."""
    budget = KVBudget(block_size=4, max_blocks=6, headroom=1)
    assert [budget.blocks_for(n) for n in (0, 1, 4, 5, 9)] == [0, 1, 1, 2, 3]
    assert budget.reserve(9, limit=24) == 13 and budget.reserve(22, limit=24) == 24
    assert budget.fits([9, 12]) and not budget.fits([9, 12, 1])   # 3 + 3 blocks; one more cell is a 7th
    assert budget.fits([1] * 6) and not budget.fits([1] * 7)


class CellPool:
    """A budget without blocks: the scheduler may only ask it in cells (`reserve`, `fits`)."""

    def __init__(self, cells: int) -> None:
        self.cells = cells

    def reserve(self, n_tokens: int, limit: int) -> int:
        return min(n_tokens, limit)

    def fits(self, cells) -> bool:
        return sum(cells) <= self.cells


def _sequence(tokenizer, seq_id: int, prompt: list[int]) -> Sequence:
    req = Request(tuple(prompt), SamplingParams(temperature=0), n_predict=4)
    return Sequence(RequestHandle(seq_id, req, engine=None), list(prompt), len(prompt), SequenceRng(1),
                    req.params, IncrementalDetokenizer(tokenizer), StopMatcher(()))


def test_the_scheduler_asks_the_budget_in_cells_only(tokenizer):
    """A 20-cell pool: of two prompts of 12 and 10 tokens only the first is admitted; once the pool
    shrinks below the first one's 13 tokens it is preempted and queued ahead of the second."""
    pool = CellPool(20)
    sched = Scheduler(EngineConfig(n_parallel=2, ctx_size=48, ubatch_size=16, batch_size=16), budget=lambda: pool)
    first, second = _sequence(tokenizer, 1, [1, 2] * 6), _sequence(tokenizer, 2, [3] * 10)
    sched.add(first)
    sched.add(second)
    plan = sched.schedule()
    assert plan.admitted == [first] and list(sched.waiting) == [second]
    postprocess(sched, plan, [(Sampled(3),)], EOG)
    assert first.num_tokens == 13
    pool.cells = 12
    plan = sched.schedule()
    assert plan.preempted == [first] and not plan.admitted and list(sched.waiting) == [first, second]
