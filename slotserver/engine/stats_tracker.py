"""Accumulates step timings and counters on the engine thread and publishes `EngineStats`.

Only the engine thread writes; it replaces `snapshot` (a frozen dataclass) in one assignment.

A step publishes when it finished a request, or when the last snapshot is `PUBLISH_EVERY_S` old;
admissions publish at once (engine.py) and an idle engine publishes on every idle wait (loop.py).
Why not every step: a snapshot is a `SlotStats` per slot, ~0.3 ms at 64 slots (27% of a lone
stream's engine CPU per token at -np 64 on the tiny test model; a sixth of a 1.6 ms decode step on
an H100), spent on numbers that /slots, /metrics and `slotserver top` read a few times a second.
The counters themselves are still added every step.
"""

from __future__ import annotations

import collections
import time

from slotserver.engine.stats import EngineStats, SlotStats, StepTimings

PHASES = ("schedule", "moves", "draft", "forward", "sample", "postprocess")
RATE_STEPS, RATE_WINDOW_S = 256, 5.0   # tokens_per_second: over at most this many steps, this recent
PUBLISH_EVERY_S = 0.02   # between snapshots while steps only decode (a finished request publishes at once)


class StatsTracker:
    def __init__(self, engine) -> None:
        self.engine = engine
        self.t0 = time.perf_counter()
        self.steps = 0
        self.sums = dict.fromkeys(PHASES, 0.0)
        self.prompt_tokens = self.predicted_tokens = self.requests_done = 0
        self.spec = [0, 0, 0]                   # speculative decoding: draft tokens, accepted, verifications
        self.cached = collections.Counter()     # slot id -> prompt tokens taken from a cache
        self.computed = collections.Counter()   # slot id -> prompt tokens computed
        self.recent: collections.deque[tuple[float, int]] = collections.deque()   # (end, tokens) of recent steps
        self.recent_tokens = 0   # their tokens' sum, kept as they come and go (_rate is O(1), not O(256))
        self.last_ms, self.last_tokens = 0.0, 0
        self.snapshot = EngineStats()
        self.published = 0.0   # perf_counter() of the last snapshot
        self.publish()

    def after_step(self, plan, n_done: int, t: list[float], runs=()) -> None:
        """runs: the tokens each sampling chunk got (StepSampling.sample): several for a verified draft."""
        self.steps += 1
        for name, a, b in zip(PHASES, t, t[1:]):
            self.sums[name] += (b - a) * 1000
        n_sampled = sum(len(r) for r in runs) if runs else sum(1 for c in plan.chunks if c.sample)
        for c, r in zip((c for c in plan.chunks if c.sample), runs):
            if c.draft:
                self.spec = [self.spec[0] + len(c.draft), self.spec[1] + len(r) - 1, self.spec[2] + 1]
        self.prompt_tokens += sum(c.n for c in plan.chunks if c.start < c.seq.prompt_end)
        self.predicted_tokens += n_sampled
        self.requests_done += n_done
        self.last_ms, self.last_tokens = (t[-1] - t[0]) * 1000, plan.n_tokens
        if len(self.recent) == RATE_STEPS:
            self.recent_tokens -= self.recent.popleft()[1]
        self.recent.append((t[-1], n_sampled))
        self.recent_tokens += n_sampled
        if n_done or t[-1] - self.published >= PUBLISH_EVERY_S:
            self.publish()

    def admitted(self, seqs) -> None:
        """Requests that just took their slots: their prompts' reused and computed tokens (hit rates)."""
        for seq in seqs:
            self.cached[seq.slot_id] += seq.num_cached
            self.computed[seq.slot_id] += max(0, seq.num_prompt - seq.num_cached)

    def _rate(self) -> float:
        """Tokens per second over the last RATE_STEPS steps that ended within RATE_WINDOW_S (the
        first one's tokens excluded: the span starts when it ended). Steps end in time order, so
        the ones out of the window are the oldest, dropped for good."""
        now, recent = time.perf_counter(), self.recent
        while recent and now - recent[0][0] >= RATE_WINDOW_S:
            self.recent_tokens -= recent.popleft()[1]
        if len(recent) < 2:
            return 0.0
        span = recent[-1][0] - recent[0][0]
        return (self.recent_tokens - recent[0][1]) / span if span > 0 else 0.0

    def publish(self) -> None:
        e = self.engine
        self.published = time.perf_counter()
        n = max(self.steps, 1)
        timings = StepTimings(**{k: v / n for k, v in self.sums.items()},
                              last_step_ms=self.last_ms, last_step_tokens=self.last_tokens)
        self.snapshot = EngineStats(
            slots=tuple(self._slot(s) for s in e.sched.slots.slots), queue_len=len(e.sched.waiting),
            n_active=len(e.sched.running()), steps=self.steps, prompt_tokens=self.prompt_tokens,
            predicted_tokens=self.predicted_tokens, requests_done=self.requests_done,
            defrag=e.config.defrag, defrag_moves=e.cache.n_moves, defrag_bytes=e.cache.bytes_moved,
            layout=e.cache.name, kv_bytes=e.cache.bytes_used(), timings=timings,
            tokens_per_second=self._rate(), uptime_s=time.perf_counter() - self.t0,
            prompt_tokens_cached=sum(self.cached.values()), **self._ram_cache(),
            spec_draft_tokens=self.spec[0], spec_accepted_tokens=self.spec[1], spec_drafts=self.spec[2],
            threads=e.threads.last if e.threads.enabled else 0, thread_switches=e.threads.switches,
        )

    def _ram_cache(self) -> dict:
        pc = self.engine.prompt_cache
        if pc is None:
            return {}
        return {"ram_cache_entries": len(pc.entries), "ram_cache_bytes": pc.bytes, "ram_cache_hits": pc.hits}

    def _slot(self, slot) -> SlotStats:
        seq, e = slot.seq, self.engine
        tps, now = 0.0, time.perf_counter()
        if seq is not None and seq.t_prompt_done and seq.num_generated > 1:
            tps = (seq.num_generated - 1) / max(now - seq.t_prompt_done, 1e-6)
        return SlotStats(
            id=slot.id, stream=e.sched.streams.stream_of[slot.id],
            state="idle" if seq is None else "processing", id_task=-1 if seq is None else seq.id,
            n_ctx=e.config.n_cells, cells_used=slot.n_valid,
            n_prompt=0 if seq is None else seq.num_prompt, n_cached=0 if seq is None else seq.num_cached,
            n_generated=0 if seq is None else max(0, seq.num_generated), tokens_per_second=tps,
            elapsed_s=now - seq.t_start if seq is not None and seq.t_start else 0.0,
            prompt_cached=self.cached[slot.id], prompt_computed=self.computed[slot.id],
            speculative=e.spec.enabled,
        )
