"""Step graphs: a decode step's C calls recorded once, then replayed without the Python between them.

Why: at batch 1, a SmolLM2 decode step makes ~210 kernel calls. On a 2-core AVX2 host the C in
them took ~5.6 ms and the Python around them (checks, views, output allocations, ctypes argument
conversions) ~3.5 ms, where llama.cpp's whole step took 6.6 ms. A decode step of b rows makes the
same calls on the same shapes every step; only the contents of a few input tensors change (the
embedded tokens, rope angles, positions, streams, row lengths). So, as a CUDA graph is captured and
replayed (vLLM does it for decode):

- capture: the step's body (layers, final norm, output matmul) runs once as usual while every call
  into a native library (`slotserver.runtime.native`) from this thread is recorded with its arguments
  (`native.recording`: nothing is swapped into the shared libraries, which the lab's thread may be
  loading an edited kernel against meanwhile), and every tensor the body allocates is kept: the
  recorded pointers stay valid while the graph lives;
- replay: the new step's inputs are copied into the captured input tensors, the recorded C calls
  are made again with their recorded arguments, and the logits are copied out.

A capture is refused (the step runs as usual) when the body
- did any torch computation: anything but allocating (`empty`; `zeros`, which a replay zeroes
  again) and taking views (a replay would skip it), or read a tensor's value into Python (`item`, `tolist`, ...);
- called a C function not declared `replay=True` in `native.signature` (its arguments may hold a
  value of the step);
- fails the check replay: every buffer the body allocated is filled with NaN and the graph is
  replayed on the same inputs; its logits must equal the captured ones bit for bit. A C call the
  recorder did not see (a ctypes function not called through a library `native.build` returned)
  leaves NaN behind and fails it.
A refused batch size is tried again at most MAX_TRIES times per kernel set and cache.

A capture runs the step more than once (the body, the check replay, after a refused check the body
again): fine for K/V (the same cells rewritten), not for a hybrid model's recurrent states, which
each run advances a token; the caller's `rewind` saves them first and puts them back before each
later run (model.py passes RecurrentState.rewinder).

Graphs serve decode-only batches of up to MAX_ROWS rows, keyed on (rows, contiguous streams,
threads) and dropped when the kernel set or the cache's layout changes (a lab reload, a layout
swap). A replay advances the kernel set's call counts by the captured step's; the per-op mean times
come from the steps run as usual.

Why up to 32 rows: the Python of a step grows with its rows (output allocations, larger tensors to
set up), and while it runs the other OpenMP threads spin. Measured at decode b=32 (Zen 5, AVX-512
VNNI; up to 8 rows against up to 32, alternating in one process): SmolLM2 Q4_K_M 17.1-17.2 ->
15.3-15.5 ms a step, qwen2 0.5B Q4_K_M 38.4-38.5 -> 34.1-34.4 ms. Past 32 rows a step is mostly
matmul and attention.

Memory: each graph holds its step's activations and logits (SmolLM2: ~0.9 MB a row, the 0.5B
qwen2: ~1.8 MB a row), so the graphs share a byte budget (`budget`, at least GRAPH_BYTES_MIN) and
the least recently replayed go first. Up to EAGER_ROWS rows a batch size is captured the first time
it is seen (small graphs, and a single stream's decode); a larger one only once it has been seen
HOT_STEPS times since the graphs were last dropped (or it was evicted), so a batch size that
passes by while requests come and go costs no capture (a capture costs about one extra step: the
check replay).
"""

from __future__ import annotations

import ctypes
import platform
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from slotserver.runtime import native
from slotserver.model.step_record import AllocOnly, Recorder

MAX_ROWS = 32
EAGER_ROWS = 8
HOT_STEPS = 3
GRAPH_BYTES_MIN = 128 << 20
INT_ARGS, FLOAT_ARGS = 28, 4
# The replay loop in C (step_graph.c beside this file; not hot-reloaded: read once at import).
_C_FILE = Path(__file__).with_name("step_graph.c")
REPLAY_C = _C_FILE.read_text()
_SYSV = platform.machine() in ("x86_64", "AMD64") and sys.platform.startswith("linux")
_LIB = native.build("step_graph", REPLAY_C, origin=str(_C_FILE)) if _SYSV else None
native.signature(_LIB, "replay_calls", 2, 1)
_CALL = np.dtype([("fn", "<i8"), ("a", "<i8", INT_ARGS), ("f", "<f4", FLOAT_ARGS)])
MAX_TRIES = 2


@dataclass
class StepGraph:
    calls: list[tuple[Callable, tuple]]   # (C function, its arguments) in call order
    inputs: list[torch.Tensor]            # the captured step's inputs, refilled by each replay
    logits: torch.Tensor                  # [rows, vocab], written by the last calls
    zeroed: list[torch.Tensor]            # allocated as zeros (parts adding into their columns)
    keep: list[torch.Tensor]              # every tensor the body allocated or viewed
    counts: dict[str, int]                # kernel op -> calls per step (the kernel set's counters)
    owned: int = 0                        # bytes of the tensors the body allocated (what the graph holds)

    packed: np.ndarray | None = None      # the calls for replay_calls (None: called from Python)

    def __post_init__(self) -> None:
        self.packed = _pack(self.calls)
        self._failed = np.zeros(1, dtype=np.int64)

    def replay(self, inputs: list[torch.Tensor], out: torch.Tensor | None = None) -> torch.Tensor:
        """The step on new `inputs` -> its logits: a copy, written into `out` where given (a caller's
        reused buffer of the logits' shape: no fresh [rows, vocab] tensor each step)."""
        for dst, src in zip(self.inputs, inputs, strict=True):
            dst.copy_(src)
        for t in self.zeroed:
            t.zero_()
        if self.packed is not None:
            rc = _LIB.replay_calls(self.packed.ctypes.data, self._failed.ctypes.data, len(self.packed))
            if rc:
                self._fail(self.calls[int(self._failed[0])][0], rc)
        else:
            for fn, args in self.calls:
                rc = fn(*args)
                if rc:
                    self._fail(fn, rc)
        return self.logits.clone() if out is None else out.copy_(self.logits)

    @staticmethod
    def _fail(fn: Callable, rc: int) -> None:
        raise RuntimeError(f"{fn.__name__} failed with {rc} in a replayed decode step")


@dataclass
class StepGraphs:
    """The graphs of one model: `run` replays, captures or runs the body as usual."""

    max_rows: int = MAX_ROWS
    budget: int = GRAPH_BYTES_MIN         # bytes all graphs may hold together
    graphs: dict[tuple, StepGraph] = field(default_factory=dict)   # least recently replayed first
    tries: dict[tuple, int] = field(default_factory=dict)
    seen: dict[tuple, int] = field(default_factory=dict)   # steps of each uncaptured key
    owner: tuple = ()                     # (kernel set, cache layout) the graphs were captured with
    lock: threading.Lock = field(default_factory=threading.Lock)   # a graph's buffers serve one step at a time

    def run(self, owner: tuple, key: tuple, inputs: list[torch.Tensor], body: Callable[[], torch.Tensor],
            counters: dict[str, list], out: torch.Tensor | None = None,
            rewind: Callable[[], Callable[[], None]] | None = None) -> torch.Tensor:
        """The step's logits: replayed (into `out` where given), captured, or `body()` as usual.
        rewind: for a body that moves state a second run must not move again (`capture`)."""
        if not self.lock.acquire(blocking=False):   # another thread's step (two engines on one model)
            return body()
        try:
            return self._run(owner, key, inputs, body, counters, out, rewind)
        finally:
            self.lock.release()

    def _run(self, owner: tuple, key: tuple, inputs: list[torch.Tensor], body: Callable[[], torch.Tensor],
             counters: dict[str, list], out: torch.Tensor | None,
             rewind: Callable[[], Callable[[], None]] | None) -> torch.Tensor:
        if len(owner) != len(self.owner) or any(a is not b for a, b in zip(owner, self.owner)):
            self.graphs.clear()
            self.tries.clear()
            self.seen.clear()
            self.owner = owner
        graph = self.graphs.pop(key, None)
        if graph is not None:
            self.graphs[key] = graph           # the most recently replayed last
            for op, n in graph.counts.items():
                counters[op][0] += n
            return graph.replay(inputs, out)
        self.seen[key] = self.seen.get(key, 0) + 1
        if self.tries.get(key, 0) >= MAX_TRIES or (key[0] > EAGER_ROWS and self.seen[key] < HOT_STEPS):
            return body()
        self.tries[key] = self.tries.get(key, 0) + 1
        graph, logits = capture(body, inputs, counters, rewind)
        if graph is not None:
            self._keep(key, graph)
        return logits

    def _keep(self, key: tuple, graph: StepGraph) -> None:
        """Add a captured graph, dropping the least recently replayed ones past the budget. A graph
        larger than the whole budget is not kept, and its key not captured again."""
        if graph.owned > self.budget:
            self.tries[key] = MAX_TRIES
            return
        self.tries.pop(key, None)              # captured: a later eviction may capture it again
        self.seen.pop(key, None)
        self.graphs[key] = graph
        while self.nbytes() > self.budget:
            self.graphs.pop(next(iter(self.graphs)))

    def nbytes(self) -> int:
        """Bytes the graphs hold (their steps' activations and logits)."""
        return sum(g.owned for g in self.graphs.values())


def capture(body: Callable[[], torch.Tensor], inputs: list[torch.Tensor], counters: dict[str, list],
            rewind: Callable[[], Callable[[], None]] | None = None) -> tuple[StepGraph | None, torch.Tensor]:
    """Run `body` recording it -> (graph or None where refused, the step's logits).

    A capture runs the step twice (the body, then the check replay), and a refused check a third
    time (the body again). Writing K/V is the same the second time; a hybrid model's recurrent
    states are not (each run advances them a token). `rewind`, called before the body, saves such
    state and returns what puts it back, which runs before each later run."""
    saved = [t.clone() for t in inputs]
    undo = rewind() if rewind is not None else (lambda: None)
    before = {op: acc[0] for op, acc in counters.items()}
    recorder, mode = Recorder(), AllocOnly()
    with recorder.watching(), mode:
        logits = body()
    if recorder.refused or mode.refused or not isinstance(logits, torch.Tensor):
        return None, logits
    counts = {op: acc[0] - before.get(op, 0) for op, acc in counters.items() if acc[0] != before.get(op, 0)}
    owned = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in mode.fresh}
    graph = StepGraph(recorder.calls, list(inputs), logits, mode.zeroed, mode.keep, counts, sum(owned.values()))
    expected = logits.clone()
    for t in mode.fresh:                   # poison: what the replay does not write stays NaN
        t.fill_(float("nan") if t.is_floating_point() else 0)
    undo()
    if torch.equal(graph.replay(saved), expected):
        return graph, expected
    for dst, src in zip(inputs, saved):    # a refused check: the step again, as usual (K/V rewritten)
        dst.copy_(src)
    undo()
    return None, body()


def _pack(calls: list[tuple[Callable, tuple]]) -> np.ndarray | None:
    """The calls as replay_calls' records; None where the C loop is unavailable or an argument
    type is not a pointer, an integer or a float32."""
    if _LIB is None:
        return None
    out = np.zeros(len(calls), dtype=_CALL)
    for i, (fn, args) in enumerate(calls):
        ints, floats = [], []
        for t, v in zip(fn.argtypes, args, strict=True):
            if t is ctypes.c_float:
                floats.append(float(v))
            elif t in (ctypes.c_void_p, ctypes.c_int64, ctypes.c_int):
                ints.append(int(v or 0))
            else:
                return None
        if len(ints) > INT_ARGS or len(floats) > FLOAT_ARGS:
            return None
        out["fn"][i] = ctypes.cast(fn, ctypes.c_void_p).value
        out["a"][i, : len(ints)] = ints
        out["f"][i, : len(floats)] = floats
    return out
