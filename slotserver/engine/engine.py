"""The slot engine: continuous batching over N slots on its own thread.

`step()` reads as the design says: schedule, apply moves, forward, sample, postprocess. Clients
talk to the engine only through thread-safe verbs (`submit`, `cancel`, `call`) that leave a
message in the inbox; the engine handles them at the next step boundary.
"""

from __future__ import annotations

import itertools
import threading
import time
from concurrent.futures import Future
from typing import Callable

import torch

from slotserver.runtime.batch import Batch, SeqChunk
from slotserver.model.bundle import ModelBundle
from slotserver.model.sampling.infill import InfillVocab
from slotserver.engine.config import EngineConfig
from slotserver.engine.stats_tracker import StatsTracker
from slotserver.lab.lab import Lab
from slotserver.engine.grammar import Grammars
from slotserver.engine.inbox import Inbox
from slotserver.engine.loop import EngineLoop
from slotserver.engine.sleep import Sleeper
from slotserver.engine.masks import MaskFiller
from slotserver.engine.outbox import Outbox
from slotserver.engine.thread_tuner import ThreadTuner
from slotserver.engine.prompt_cache import PromptCache, RamCacheHooks
from slotserver.engine.port import EnginePort
from slotserver.engine.intake import new_sequence, validate
from slotserver.engine.kv_shift import check_shift_support
from slotserver.engine import engine_setup as setup, recurrent_policy
from slotserver.engine.overlap import Overlap
from slotserver.engine.lora_scales import LoraScales
from slotserver.engine.postprocess import postprocess, progress_event
from slotserver.engine.request import Request, RequestError, RequestHandle
from slotserver.engine.scheduler import Scheduler, StepPlan
from slotserver.engine.stats import EngineStats
from slotserver.engine.step_sampling import StepSampling

class Engine:
    def __init__(self, bundle: ModelBundle, config: EngineConfig, draft: ModelBundle | None = None) -> None:
        """draft: the draft model of `--spec-type draft-simple` (same vocabulary, checked)."""
        s, self.bundle, self.config = bundle.model.spec, bundle, config
        if config.n_cells > bundle.model.rope.max_pos:
            raise RequestError(f"a slot's context ({config.n_cells}) exceeds the model's ({bundle.model.rope.max_pos})")
        recurrent_policy.check_config(config, bundle.model)   # a hybrid model: what it cannot serve with
        recurrent = recurrent_policy.is_recurrent(bundle.model)
        self.cache = setup.kv_cache(config, bundle)
        spec = self.cache.spec
        self.prompt_cache = PromptCache(config.cache_ram_mib << 20 if config.cache_ram_mib > 0 else -1) \
            if config.cache_ram_mib and not recurrent else None   # --cache-ram
        self.disk_cache = setup.disk_cache(config, bundle, spec) if config.cache_disk is not None else None
        hooks = None if recurrent else RamCacheHooks(self, self.prompt_cache, config.cache_idle_slots,
                                                     config.kv_unified, self.disk_cache)   # + slot sharing
        check_shift_support(config, bundle.model, self.cache)   # --context-shift / --cache-reuse
        self.sched = Scheduler(config, budget=lambda: self.cache.budget(), hooks=hooks,  # paged: admit by free blocks
                               add_bos=bundle.tokenizer.add_bos,
                               recurrent=self._state_positions if recurrent else None)
        self.sampling = StepSampling(s.vocab_size, config.spec.synth_probs, bundle.tokenizer.eog_ids,
                                     fim=InfillVocab.of(bundle.tokenizer))
        self.spec = setup.speculator(config, bundle, draft)   # --spec-type: drafts verified in the forward
        self.eog = bundle.tokenizer.eog_ids
        self.lora = LoraScales(bundle.model.lora.adapters if bundle.model.lora else [],   # --lora
                               [0.0 if bundle.config.lora_init_without_apply else s for _, s in bundle.config.lora])
        self.grammars = Grammars(bundle.tokenizer)   # llguidance's vocabulary, built on first use
        self.masks = MaskFiller(self.grammars)
        self.port = EnginePort(self)    # the verbs the lab and the slot files use
        self.lab = Lab(self.port, bundle.config.kernels_dir, bundle.config.layouts_dir)
        self.threads = ThreadTuner(setup.tuned_threads(config, bundle), torch.set_num_threads, torch.get_num_threads)   # --adaptive-threads
        self.tracker = StatsTracker(self)
        self._wake = threading.Event()
        self.inbox = Inbox(self.sched, self.grammars, config.n_parallel + config.queue_limit, self._wake)
        self.outbox = Outbox()   # events of a step, one wake-up per event loop
        self.device = bundle.model.device
        self._logits = torch.empty(0, bundle.model.weights.output.out_features, device=self.device)   # grown (_forward)
        self._ids = itertools.count(1)
        self.overlap = Overlap(self, config.overlaps(self.device) and not recurrent,   # --async-steps
                               self._forward_or_roll_back)
        self.loop = EngineLoop(self, self._wake)   # the thread, the watcher
        self.sleeper = Sleeper(self, config.sleep_idle_s)   # --sleep-idle-seconds

    # -- client verbs (any thread) -------------------------------------------------------------
    def submit(self, request: Request, loop=None, parent: RequestHandle | None = None) -> RequestHandle:
        """Queue a request. `parent`: an earlier handle with the same prompt (n > 1 choices): this one
        waits for the parent's prefill and copies its prompt KV instead of computing it again."""
        validate(request, self.config, self.bundle.model.spec.vocab_size)
        if parent is not None and parent.request.prompt_ids != request.prompt_ids:
            raise RequestError("a sibling request must have its parent's prompt")
        scales = self.lora.resolve(request.lora)   # --lora: an id naming no adapter is a RequestError
        self.inbox.take()
        handle = RequestHandle(next(self._ids), request, self, loop, self.outbox)
        handle.seq = new_sequence(handle, self.eog, self.bundle.tokenizer)
        handle.seq.lora, handle.seq.cache_ns = (scales if any(scales) else ()), self.lora.cache_ns(scales)
        handle.seq.parent = parent.seq if parent is not None else None
        self.inbox.post(("submit", handle.seq))
        return handle

    def cancel(self, request_id: int) -> None:
        self.inbox.post(("cancel", request_id))

    def call(self, fn: Callable[[], object]) -> Future:
        """Run `fn()` on the engine thread between two steps; -> a Future of its result."""
        fut: Future = Future()
        self.inbox.post(("call", fn, fut))
        return fut

    def slot_action(self, slot_id: int, action: str, filename: str | None = None) -> Future:
        """Save, restore or erase an idle slot's cache on the engine thread; -> Future[dict]."""
        from slotserver.engine import slot_files

        actions = {"save": lambda: slot_files.save(self, slot_id, filename),
                   "restore": lambda: slot_files.restore(self, slot_id, filename),
                   "erase": lambda: slot_files.erase(self, slot_id)}
        if action not in actions:
            raise RequestError(f"action must be one of save, restore, erase; got {action!r}")
        return self.call(actions[action])

    def wake(self) -> None:
        self._wake.set()

    def stats(self) -> EngineStats:
        return self.tracker.snapshot

    def start(self, watch: bool = False) -> "Engine":
        """Run the engine loop on a new thread; with `watch`, saves in the kernels/layouts folders hot-reload."""
        self.loop.start(watch)
        return self

    def run(self, watch: bool = False) -> None:
        """Run the engine loop on the calling thread until `stop()`.

        Why a caller would rather give its own thread: torch's OpenMP runtime (libgomp) stops
        spin-waiting between ops once more OpenMP threads exist than cores, and every thread that
        has run a parallel torch op keeps its own team. On 2 cores a decode step then takes 1.6-1.9x
        longer. The server therefore loads the model, builds the engine and runs this loop on one
        thread, and no other thread of the process runs parallel torch ops (docs/performance.md).
        """
        if watch:
            self.loop.start_watcher()
        self.loop.run()

    def stop(self) -> None:
        self.loop.stop()
        if self.sched.hooks is not None:   # None for a hybrid model (engine/recurrent_policy.py)
            self.sched.hooks.on_stop()   # --cache-disk: what the slots hold goes to disk (the thread is stopped)
        self.lab.close()   # a swap still waiting for a step is refused, not waited for
        self.masks.close()
        self.threads.restore()

    # -- the engine thread -----------------------------------------------------------------------
    def release_buffers(self) -> None:
        """Drop the logits buffer (sleep); `_forward` grows a new one on the next step."""
        self._logits = torch.empty(0, self._logits.shape[1], device=self.device)

    def step(self) -> bool:
        """One step. -> False when there was nothing to do. Its events leave when it ends."""
        try:
            return self._step()
        except BaseException:
            self.overlap.in_flight = None   # its requests fail with this step (EngineLoop)
            raise
        finally:
            self.outbox.flush()

    def settle(self) -> None:
        """Land the step in flight, if any (overlap.py): its tokens reach their requests."""
        try:
            if self.overlap.in_flight is not None:
                self.overlap.land()
        finally:
            self.outbox.flush()

    def _step(self) -> bool:
        """schedule, apply moves, forward, sample, postprocess; `t` times each part (stats)."""
        self.sleeper.wake_if_needed()   # asleep (--sleep-idle-seconds) and asked for: weights and KV back
        if self.overlap.in_flight is not None:   # client messages and lab swaps see no step in flight
            if not self.inbox.pending() and not self.lab.has_pending() and self.overlap.step_ahead():
                return True
            self.overlap.land()
        self.inbox.drain()
        self.lab.apply_pending()
        if not self.sched.has_work():
            return False
        t = [time.perf_counter()]
        plan = self._schedule()
        t.append(time.perf_counter())
        self._apply_moves(plan)
        t.append(time.perf_counter())
        self._draft(plan)
        t.append(time.perf_counter())
        masks = self.masks.start([c.seq.grammar for c in plan.chunks if c.sample])  # filled during the forward
        logits = self._forward_or_roll_back(plan)
        self._checkpoint(plan)
        t.append(time.perf_counter())
        allowed = masks.result()
        if self.overlap.leave(plan, logits, allowed, t):   # --async-steps: its tokens land next step
            return True
        runs = self.sampling.sample(plan, logits, allowed)   # per sampling chunk: its token(s)
        self.spec.learn(plan, runs)
        t.append(time.perf_counter())
        done = postprocess(self.sched, plan, runs, self.eog)
        self._trim_rejected(plan)
        t.append(time.perf_counter())
        self.inbox.release(len(done))
        self.tracker.after_step(plan, len(done), t, runs)
        return True

    def _schedule(self) -> StepPlan:
        plan = self.sched.schedule()
        if plan.admitted:  # /slots shows a slot busy before its first token reaches the client
            self.tracker.admitted(plan.admitted)
            self.tracker.publish()
            for seq in plan.admitted:
                if seq.request.return_progress:
                    seq.handle.emit(progress_event(seq, start=True))
        return plan

    def _apply_moves(self, plan: StepPlan) -> None:
        """KV shifts (context shift, cache reuse: cells moved down, K re-rotated; engine/kv_shift.py),
        trims and defrag moves, then n > 1 forks: a sibling starts from its parent's prompt KV
        (paged: shared blocks). Shifts come first: their streams are the plan's before defrag, and an
        admission's trim keeps what a cache-reuse shift put in place."""
        for shift in plan.shifts:
            self.cache.shift(self.bundle.model, shift)
        self.cache.apply(plan.moves, plan.trims)
        for f in plan.forks:
            self.cache.layout.copy_stream(f.src, f.dst, f.n_cells)

    def _state_positions(self, stream: int) -> list[int]:
        """A hybrid model's stream: where its state can be put back to (none before the first forward)."""
        state = self.cache.recurrent
        return state.positions(stream) if state is not None else []

    def _checkpoint(self, plan: StepPlan) -> None:
        """A hybrid model's prefill chunks that end at a checkpoint mark: their streams' states copied."""
        for c in plan.chunks:
            if c.checkpoint and self.cache.recurrent is not None:
                self.cache.recurrent.snapshot(c.stream)

    def _draft(self, plan: StepPlan) -> None:
        """Speculative decoding: decode chunks of eligible sequences get draft tokens (speculative/)."""
        if not self.spec.enabled or not plan.chunks:
            return
        budget = self.cache.budget()
        fits = None
        if budget is not None:   # paged: the draft's cells must fit the pool beside every slot's
            held = self.sched.held_cells()
            fits = lambda seq, n: budget.fits([n if i == seq.slot_id else h for i, h in enumerate(held)])  # noqa: E731
        self.spec.draft(plan, {s.id for s in self.sched.running()}, self.config.step_tokens - plan.n_tokens, fits)

    def _trim_rejected(self, plan: StepPlan) -> None:
        """Paged: blocks a rejected draft's cells took go back, so the pool holds what the scheduler
        counts (a sequence's tokens); flat layouts keep the cells, written over by the next step."""
        for c in plan.chunks:
            if c.draft:
                self.cache.trim(c.stream, c.seq.num_tokens)

    def _forward_or_roll_back(self, plan: StepPlan, tokens: torch.Tensor | None = None) -> torch.Tensor | None:
        """The forward; a kernel just swapped in that fails on real shapes is rolled back and the
        step runs again on the previous kernels (the lab's rollback). tokens: see `_forward`."""
        states = self.cache.recurrent   # a hybrid model's: the retry starts from the states before this step
        saved = None
        if states is not None and self.lab.may_roll_back():
            saved = states.backup([c.stream for c in plan.chunks])
        try:
            logits = self._forward(plan, tokens)
        except Exception as e:  # noqa: BLE001 - re-raised unless the lab had something to roll back
            if not self.lab.rollback(e):
                raise
            if saved is not None:
                states.restore_backup(saved)
            logits = self._forward(plan, tokens)
        self.lab.forward_ok()
        return logits

    def _forward(self, plan: StepPlan, tokens: torch.Tensor | None = None) -> torch.Tensor | None:
        """tokens: an overlapped decode step's input ids `[chunks]` where the model runs (the step in
        flight's sampled ids, not on the host yet), copied into the batch on the device."""
        if not plan.chunks:
            return None
        if tokens is not None:   # one-token decode chunks (overlap.plain_decode); 0 holds each id's place
            chunks = [SeqChunk(c.stream, c.start, [0], lora=c.seq.lora) for c in plan.chunks]
        else:
            chunks = [SeqChunk(c.stream, c.start, c.seq.tokens[c.start: c.start + c.n] + list(c.draft),
                               all_logits=bool(c.draft), logits=c.sample,
                               prompt=not c.draft and c.start + c.n <= c.seq.prompt_end, lora=c.seq.lora)
                      for c in plan.chunks]
        rows = sum(c.sample + len(c.draft) for c in plan.chunks)
        if self._logits.shape[0] < rows:   # one buffer for every step's logits (see LlamaModel.forward)
            self._logits = torch.empty(rows, self._logits.shape[1], device=self.device)
        batch = Batch.build(chunks, self.device)
        if tokens is not None:
            batch.tokens.copy_(tokens, non_blocking=True)   # queued after the sampler that made them
        n_threads, t0 = self.threads.choose(batch.n_tokens), time.perf_counter()
        logits = self.bundle.model.forward(batch, self.cache, self._logits)
        self.threads.record(batch.n_tokens, n_threads, time.perf_counter() - t0)
        return logits   # [n_sample, vocab], where the model ran (StepSampling copies what the host needs)
