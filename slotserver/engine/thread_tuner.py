"""The CPU forward's thread count, measured: `-t N` or one thread, whichever steps faster now.

Why: torch's OpenMP (libgomp) runs each parallel op as a team whose threads meet at a barrier,
a few hundred times a decode step. On cores shared with other busy processes (a laptop compiling,
a VM's neighbours, two servers on one host), a team member that has lost its core holds every
barrier until the scheduler gives it one back: on this project's 2-core host, with another
process's interpreted Triton tests running, the default model's decode step took 107-362 ms with
2 threads against 13 ms with one (docs/performance.md, "Shared cores"). Nothing in the process can see that coming;
a step's time shows it at once. So the engine times its forwards and now and then runs a couple
of steps with the other count (a "probe"); if they were faster by a margin, that count serves. A
probe that loses waits twice as long before the next one (up to MAX_PERIOD_S), so a quiet host
pays a few one-thread steps a minute at most; a busy host gets back to `-t N` within a probe
period once the cores are free again.

The numbers do not depend on the thread count: every C kernel splits its work by output rows or
heads, never along a sum (tests/test_thread_tuner.py checks the tokens and top log-probs of -t 1
and -t 2 bit for bit), so switching between two steps changes no answer. The torch formulations
that serve without a compiler (or with SLOTSERVER_NATIVE=0) do not keep that (measured: GGUF
blocks differ), so the engine does not tune there (engine_setup.py `tuned_threads`).

Sizes: each power-of-two bucket of the forward's token count has its own count and probes: a
decode step of a few rows waits at hundreds of small barriers and loses the most to a busy host,
while a prompt chunk's big matmuls amortize theirs and may still gain from -t (measured, not
assumed: under the same load a decode size can serve on one thread while prompt chunks keep two).
Decode steps of a steady batch repeat one size, so their probes compare like with like.
`--adaptive-threads off` (or `-t 1`, or a GPU) keeps the count fixed.
"""

from __future__ import annotations

import logging
import statistics
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable

log = logging.getLogger("slotserver.engine")

PROBE_STEPS = 2        # steps a probe runs with the other count
MIN_SAMPLES = 3        # recent steps of the serving count a probe is compared with
MARGIN = 0.10          # the other count must be this much faster to take over
MIN_PERIOD_S = 1.0     # between probes of one step size, after a switch
MAX_PERIOD_S = 32.0    # ... doubling after each probe that lost


@dataclass
class _SizeStats:
    """One bucket of step sizes: its serving count, and recent forward seconds per count."""

    serving: int
    recent: dict[int, deque] = field(default_factory=dict)
    probing: int = 0                 # probe steps left to run
    period: float = MIN_PERIOD_S
    next_probe: float = 0.0

    def times(self, n: int) -> deque:
        return self.recent.setdefault(n, deque(maxlen=5))


class ThreadTuner:
    def __init__(self, threads: int, set_threads: Callable[[int], None], get_threads: Callable[[], int],
                 clock: Callable[[], float] = time.monotonic) -> None:
        """threads: `-t`, the count to serve with while it is the faster one (> 1 to tune at all).
        set_threads / get_threads: torch's, called on the thread that runs the forwards (torch keeps
        OpenMP's count per thread)."""
        self.full = threads
        self._set, self._get, self._clock = set_threads, get_threads, clock
        self._sizes: dict[int, _SizeStats] = {}
        self.last = threads               # the count of the last forward (stats)
        self.switches = 0

    @property
    def enabled(self) -> bool:
        return self.full > 1

    def _other(self, st: _SizeStats) -> int:
        return 1 if st.serving == self.full else self.full

    def _bucket(self, size: int) -> _SizeStats:
        key = max(size - 1, 0).bit_length()   # 1 | 2 | 3-4 | 5-8 | ...
        st = self._sizes.get(key)
        if st is None:
            st = self._sizes[key] = _SizeStats(self.full, next_probe=self._clock() + MIN_PERIOD_S)
        return st

    def choose(self, size: int) -> int:
        """Before a forward of `size` tokens: the thread count it runs with (set for the kernels)."""
        if not self.enabled:
            return self.full
        st = self._bucket(size)
        if not st.probing and len(st.times(st.serving)) >= MIN_SAMPLES and self._clock() >= st.next_probe:
            st.probing = PROBE_STEPS
        n = self._other(st) if st.probing else st.serving
        if self._get() != n:
            self._set(n)
        self.last = n
        return n

    def record(self, size: int, n: int, seconds: float) -> None:
        """After that forward: its wall seconds."""
        if not self.enabled:
            return
        st = self._bucket(size)
        st.times(n).append(seconds)
        if st.probing and n != st.serving:
            st.probing -= 1
            if not st.probing:
                self._decide(size, st)

    def restore(self) -> None:
        """The calling thread back to `-t` (the engine stops; a test stepped it on its own thread)."""
        if self.enabled and self._get() != self.full:
            self._set(self.full)

    def _decide(self, size: int, st: _SizeStats) -> None:
        other = self._other(st)
        probe = statistics.median(list(st.times(other))[-PROBE_STEPS:])
        serving = statistics.median(st.times(st.serving))
        if probe < serving * (1 - MARGIN):
            log.info("compute threads %d -> %d for steps of ~%d tokens: %.1f ms with %d, %.1f ms with %d "
                     "(cores shared with other work; --adaptive-threads off keeps -t)", st.serving, other,
                     size, 1e3 * probe, other, 1e3 * serving, st.serving)
            st.serving, st.period = other, MIN_PERIOD_S
            self.switches += 1
        else:
            st.period = min(2 * st.period, MAX_PERIOD_S)
        st.next_probe = self._clock() + st.period
