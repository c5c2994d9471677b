"""Overlapped decode steps (--async-steps): the host schedules and launches step N+1 before step
N's sampled tokens reach it, as vLLM's async scheduling and SGLang's overlap scheduler do.

Why: on a GPU a batch-1 decode step is ~1 ms of host work (build the batch, launch the CUDA graph,
postprocess) and ~1.4 ms of device work. Run in turn, the two add up; overlapped, the host's work
hides under the device's (docs/gpu.md, second GPU round: the engine did 487 tok/s where the model
alone did 676-738).

How (the engine's `_step`, engine.py): a step whose every chunk is a plain decode chunk (below)
and whose rows the device samples (`StepSampling.sample_ids`) is left *in flight*: its sampled ids
stay a device tensor, copied to pinned host memory behind an event (sampled_ids.py). The next step,
when nothing asks for the scheduler (`successor`), is the same sequences one position further; its
input tokens are copied on the device from the ids in flight, its forward and sampler are launched,
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
trimmed when the step lands). Stops known before the launch (max_tokens, a full slot, so a context
shift) are not overlapped. With batch-invariant kernels (the CPU's) the extra row changes no other
row; where a matmul's algorithm follows the row count (cuBLAS), it may change the last bits of the
other rows as any arrival or departure of a request does.
"""

from __future__ import annotations

from dataclasses import dataclass

from slotserver.engine.sampled_ids import SampledIds
from slotserver.engine.scheduler import ScheduledChunk, Scheduler, StepPlan
from slotserver.runtime.paged_contract import KVBudget


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
    def __init__(self, enabled: bool, n_cells: int) -> None:
        self.enabled, self.n_cells = enabled, n_cells
        self.in_flight: InFlight | None = None
        self.launched = 0    # steps launched ahead of the previous step's tokens (tests, /props)
        self.discarded = 0   # rows of sequences that had stopped one step before (see the module doc)

    @staticmethod
    def can_leave(plan: StepPlan) -> bool:
        """Whether a scheduled step may stay in flight after its sampler is launched."""
        return bool(plan.chunks) and all(plain_decode(c) for c in plan.chunks)

    def successor(self, sched: Scheduler, budget: KVBudget | None) -> StepPlan | None:
        """The step after the one in flight, as the scheduler would plan it once that step's tokens
        are in: every chunk one position further, same streams. None where the scheduler has
        something else to do or a sequence may stop on a known limit: no request waits for a free slot, the
        running sequences are exactly the step's, none reaches max_tokens or a full slot with the
        token in flight, and (paged) one more cell each still fits the pool."""
        plan = self.in_flight.plan
        running = sched.running()
        if (sched.waiting and sched.slots.idle()) or len(running) != len(plan.chunks):   # no slot: none admitted
            return None
        for c in plan.chunks:
            s = c.seq
            if s.finished or s.slot_id < 0 or sched.streams.stream_of[s.slot_id] != c.stream \
                    or s.num_tokens + 1 >= self.n_cells or 0 <= s.request.n_predict <= s.num_generated + 1:
                return None
        if budget is not None:
            held = [min(sl.seq.num_tokens + 1, self.n_cells) if sl.seq else len(sl.cached) for sl in sched.slots.slots]
            if not budget.fits(held):
                return None
        self.launched += 1
        return StepPlan(chunks=[ScheduledChunk(c.seq, c.stream, c.start + 1, 1, True) for c in plan.chunks])

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
