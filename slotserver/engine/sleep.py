"""`--sleep-idle-seconds N`: after N idle seconds the engine drops its weights and KV memory, and
the first request that needs them brings them back (llama-server's sleep).

Asleep, the process keeps what answers without the model's weights: tokenizer, chat template,
spec, kernels, configuration and the last stats snapshot, so /health, /props, /models, /slots and
/metrics answer and do not wake it. Every other route asks for a wake (`request_wake`, from the
server's WakeGate); the engine thread reloads at its next step boundary, before it handles any
message, so a request sent to a sleeping server waits for the reload and is then served as usual.
Slots keep no prompt cache across a sleep (their KV is gone).

Why on the engine thread: loading and every torch op belong to the one thread that runs the
engine loop (OpenMP teams: see Engine.run).
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from slotserver.engine.engine import Engine

log = logging.getLogger("slotserver.engine.sleep")


class Sleeper:
    def __init__(self, engine: "Engine", idle_s: float) -> None:
        self.engine, self.idle_s = engine, idle_s
        self.asleep = False
        self.wake_requested = False
        self.last_work = time.monotonic()
        self.n_sleeps = 0

    @property
    def is_sleeping(self) -> bool:
        """What /props says: a wake already asked for counts as awake (its reload is under way)."""
        return self.asleep and not self.wake_requested

    def request_wake(self) -> None:
        """Any thread: the next step boundary reloads the weights."""
        if self.asleep:
            self.wake_requested = True
            self.engine.wake()

    def worked(self) -> None:
        self.last_work = time.monotonic()

    def maybe_sleep(self) -> None:
        """Engine thread, between steps: go to sleep once idle for `idle_s` (off when <= 0)."""
        e = self.engine
        if self.asleep or self.idle_s <= 0 or time.monotonic() - self.last_work < self.idle_s:
            return
        if e.sched.has_work() or e.inbox.pending():
            return
        t0 = time.perf_counter()
        e.tracker.publish()          # /metrics serves this snapshot while asleep
        for slot in e.sched.slots.slots:
            slot.cached = []         # their KV goes with the cache memory
        e.cache.release()
        e.release_buffers()
        e.bundle.drop_weights()
        self.asleep, self.n_sleeps = True, self.n_sleeps + 1
        log.info("sleeping after %.0f idle seconds: weights and KV released (%.0f ms)", self.idle_s,
                 1000 * (time.perf_counter() - t0))

    def wake_if_needed(self) -> None:
        """Engine thread, at the start of a step: reload when asleep and anything asked for it."""
        e = self.engine
        if not self.asleep or not (self.wake_requested or e.inbox.pending()):
            return
        t0 = time.perf_counter()
        e.bundle.reload_weights()
        e.cache.restore()
        self.asleep = self.wake_requested = False
        self.worked()
        log.info("awake: weights and KV back (%.0f ms)", 1000 * (time.perf_counter() - t0))
