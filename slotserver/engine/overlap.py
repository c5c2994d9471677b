"""Overlapped decode steps (--async-steps): the host schedules and launches step N+1 before step
N's sampled tokens reach it, as vLLM's async scheduling and SGLang's overlap scheduler do.

Why: on a GPU a batch-1 decode step is ~1 ms of host work (build the batch, launch the CUDA graph,
postprocess) and ~1.4 ms of device work. Run in turn, the two add up; overlapped, the host's work
hides under the device's (docs/gpu.md, second GPU round: the engine did 487 tok/s where the model
alone did 676-738).

How (the engine's `_step`, engine.py): a step whose every chunk is a plain decode chunk (below)
and whose rows the device samples (`StepSampling.sample_ids`) is left *in flight*: its sampled ids
stay a device tensor, copied to pinned host memory behind an event (sampled_ids.py). The next step,
when nothing asks for the scheduler (`successor`), is the same sequences one position further (less
those that ended); its input tokens are copied (gathered) on the device from the ids in flight, its
forward and sampler are launched,
and only then does the host wait for the earlier ids and postprocess them (stops, events, stats)
while the device computes. Any other step first *lands* the step in flight (waits, postprocesses)
and runs as without overlap; so do client messages (submit, cancel, call) and lab swaps, which are
handled only when nothing is in flight.

What stays exact: each launched step computes the batch the scheduler would have built (the same
sequences, streams and positions), so greedy tokens are those of `--async-steps off`, with one
difference in the batches: a sequence that stops at step N on a token the host has not seen yet
(end of generation, a stop string, a sampling error) still has its row in step N+1. That row is
discarded: its token is never appended, emitted or counted, and the sequence's `num_computed`
(what the slot and the prompt caches record) stops before it; the K/V cell it wrote lies past the
slot's cached tokens, so the next user of the slot writes over it (paged layouts: its block is
trimmed when the step lands). Stops known before the launch (max_tokens, a full slot) are not
launched past, and a full slot that shifts its context (--context-shift) lands first. With batch-invariant kernels (the CPU's) the extra row changes no other
row; where a matmul's algorithm follows the row count (cuBLAS), it may change the last bits of the
other rows as any arrival or departure of a request does.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

import torch

from slotserver.engine.postprocess import postprocess
from slotserver.engine.sampled_ids import SampledIds
from slotserver.engine.scheduler import ScheduledChunk, Scheduler, StepPlan
from slotserver.runtime.paged_contract import KVBudget

if TYPE_CHECKING:
    from slotserver.engine.engine import Engine


@dataclass
class InFlight:
    """A launched step whose tokens the host has not read yet."""
    plan: StepPlan
    ids: SampledIds      # its sampled ids: `tokens` on the device, `rows()` on the host
    stamps: list[float]  # its phase stamps up to the sampler's launch (StatsTracker.PHASES, less one)


def plain_decode(c: ScheduledChunk) -> bool:
    """A chunk an overlapped step may carry: one generated token of a running sequence, sampled,
    with nothing that needs the host's view of the previous token (a draft, a grammar's mask, a
    reasoning budget that may force the next token). Samplers beyond greedy: `sample_ids` decides."""
    s = c.seq
    return c.n == 1 and c.sample and not c.draft and c.start >= s.prompt_end and not s.finished \
        and s.grammar is None and s.reasoning is None


class Overlap:
    """The engine's overlapped steps: which step stays in flight, the step launched after it, and
    its landing. The engine's `_step` decides when (client messages and lab swaps land it first)."""

    def __init__(self, engine: "Engine", enabled: bool,
                 forward: Callable[[StepPlan, torch.Tensor | None], torch.Tensor | None]) -> None:
        """forward(plan, tokens): the engine's forward (with the lab's rollback); tokens: see Engine._forward."""
        self.engine, self.enabled, self.forward = engine, enabled, forward
        self.n_cells = engine.config.n_cells
        self.in_flight: InFlight | None = None
        self.launched = 0    # steps launched ahead of the previous step's tokens (tests, gpu_model_bench)
        self.discarded = 0   # rows of sequences that had stopped one step before (see the module doc)

    def leave(self, plan: StepPlan, logits: torch.Tensor | None, allowed: torch.Tensor | None,
              t: list[float]) -> bool:
        """Sample a scheduled step where its logits are and leave it in flight, where overlap allows
        it (no grammar masks, no speculative decoding, plain decode chunks, a device sampler)."""
        e = self.engine
        if not self.enabled or allowed is not None or e.spec.enabled or not self.can_leave(plan):
            return False
        ids = e.sampling.sample_ids(plan, logits)
        if ids is None:
            return False
        t.append(time.perf_counter())
        self.in_flight = InFlight(plan, ids, t)
        return True

    def step_ahead(self) -> bool:
        """Launch the step after the one in flight (its input tokens copied on the device from that
        step's sampled ids), then land the one in flight while it runs. False: it cannot follow on."""
        e, prev, t = self.engine, self.in_flight, [time.perf_counter()]
        planned = self.successor(e.sched, e.cache.budget())
        if planned is None:
            return False
        plan, rows = planned
        t += [time.perf_counter()] * 3   # scheduled; no moves, no drafts
        logits = self.forward(plan, prev.ids.gather(rows))
        t.append(time.perf_counter())
        ids = e.sampling.sample_ids(plan, logits)
        if ids is None:   # the rows and their params are the previous step's, which sampled there
            raise RuntimeError("an overlapped step's rows could not be sampled on the device")
        t.append(time.perf_counter())
        self.land()
        self.in_flight = InFlight(plan, ids, t)
        return True

    def land(self) -> None:
        """Wait for the step in flight's ids and postprocess them. Rows of sequences that stopped at
        the step before are discarded (never appended nor counted; paged: their cell's block back)."""
        e, fl, self.in_flight = self.engine, self.in_flight, None
        t0 = time.perf_counter()
        sampled = fl.ids.rows()
        t1 = time.perf_counter()
        plan, rows = self.live(fl.plan)
        runs = [(sampled[i],) for i in rows]
        done = postprocess(e.sched, plan, runs, e.eog)
        for i in sorted(set(range(len(fl.plan.chunks))) - set(rows)):
            e.cache.trim(fl.plan.chunks[i].stream, fl.plan.chunks[i].seq.num_computed)
        t2 = time.perf_counter()
        e.inbox.release(len(done))
        e.tracker.after_step(plan, len(done), landed_stamps(fl.stamps, t1 - t0, t2 - t1, t2), runs)

    @staticmethod
    def can_leave(plan: StepPlan) -> bool:
        """Whether a scheduled step may stay in flight after its sampler is launched."""
        return bool(plan.chunks) and all(plain_decode(c) for c in plan.chunks)

    def successor(self, sched: Scheduler, budget: KVBudget | None) -> tuple[StepPlan, list[int]] | None:
        """The step after the one in flight, as the scheduler would plan it once that step's tokens
        are in, and the rows of the step in flight whose ids are its input: the same sequences one
        position further, less those that stopped at the step before and those whose token in flight
        is their last (max_tokens, a full slot). None where the scheduler has something to do: a
        request could take a free slot (or one about to be freed), defrag would move a stream, a
        running sequence is not in the step, a full slot shifts its context (--context-shift), (paged)
        the cells do not fit."""
        chunks = self.in_flight.plan.chunks
        if sched.waiting and sched.slots.idle():
            return None
        if {s.id for s in sched.running()} - {c.seq.id for c in chunks}:
            return None
        rows = []
        for i, c in enumerate(chunks):
            s = c.seq
            if s.finished:
                continue   # stopped at the step before: this row is discarded when it lands
            if s.slot_id < 0 or sched.streams.stream_of[s.slot_id] != c.stream:
                return None
            full = s.num_tokens + 1 >= self.n_cells   # with the token in flight appended
            if full and sched.shift is not None:
                return None
            if not (full or 0 <= s.request.n_predict <= s.num_generated + 1):
                rows.append(i)
        if not rows or (len(rows) < len(chunks) and (sched.waiting or not self._packed([chunks[i] for i in rows]))):
            return None
        if budget is not None:
            held = [min(sl.seq.num_tokens + 1, self.n_cells) if sl.seq else len(sl.cached) for sl in sched.slots.slots]
            if not budget.fits(held):
                return None
        self.launched += 1
        return StepPlan(chunks=[ScheduledChunk(chunks[i].seq, chunks[i].stream, chunks[i].start + 1, 1, True)
                                for i in rows]), rows

    def _packed(self, kept: list[ScheduledChunk]) -> bool:
        """With defrag on, the streams of the sequences that go on are 0..k-1: the scheduler would
        move none once the others' slots are free (else it must: a step that lands first)."""
        return self.engine.config.defrag == "off" or sorted(c.stream for c in kept) == list(range(len(kept)))

    def live(self, plan: StepPlan) -> tuple[StepPlan, list[int]]:
        """The chunks of a landing step whose sequences still run, and their rows in its sampled ids;
        the others stopped at the step before and their rows are discarded."""
        rows = [i for i, c in enumerate(plan.chunks) if not c.seq.finished]
        self.discarded += len(plan.chunks) - len(rows)
        return StepPlan(chunks=[plan.chunks[i] for i in rows]), rows


def landed_stamps(stamps: list[float], wait_s: float, post_s: float, end: float) -> list[float]:
    """A landed step's phase stamps (StatsTracker.PHASES) ending at `end`: its own host work, the
    wait for its ids counted as sampling, not the next step's launch that ran between."""
    spans = [b - a for a, b in zip(stamps, stamps[1:])]
    spans[-1] += wait_s
    spans.append(post_s)
    out = [end - sum(spans)]
    for d in spans:
        out.append(out[-1] + d)
    return out
