"""CUDA graphs: a decode step on the GPU captured once per (rows, context bucket), then replayed.

Why: a decode step of the 0.5B Qwen2.5 makes ~250 kernel launches (24 layers x norms, matmuls,
rope, the KV write, attention and its merge, the activation), each ~5-20 us of Python and driver
time, while the whole step's bytes take ~0.3 ms to read on an H100. Eager, launch time is the step
time at small batches. A graph replays every launch in one call; this is what vLLM and SGLang do
for decode, and what docs/gpu.md measures against eager.

What a graph needs, and how this meets it:
- fixed shapes and pointers: one graph per (rows, KV bucket). The attention's split count, the only
  shape that follows the batch's contents, depends on the longest visible span rounded up to a
  power of two (`split_count` in kernels/_attention_tl.py, for the strided and the paged caches),
  so the key carries that bucket; everything else reads the lengths, positions and streams from
  device tensors;
- fixed inputs: the first batch of a key becomes the graph's input; a replay copies the new batch's
  tensors into it (a decode batch is one int64 tensor, so one copy);
- the step's first run is its real run: the batch runs eagerly (compiling any Triton kernel it
  meets, writing its K/V, giving its logits), then the same body is captured without running it;
- anything the graph points at must live as long as it: the owner (kernel set, layout, weights,
  the KV storage's address, a hybrid's recurrent state and its tensors' addresses) is checked at
  every step, and a change drops every graph, so a lab reload, a layout swap or a wake from sleep
  recaptures;
- a body that cannot be captured (a lab layout that reads a value into Python, say) is remembered
  per owner and key and runs eagerly, with the reason logged once.

Paged layouts: the block table's device copy is one persistent tensor refreshed in place, and a
step's cells are placed on the host before the replay (blocks allocated, copied on write, the pool
grown) into a persistent buffer the captured write reads (`graph_step`, runtime/paged_cache.py).
A pool that grows moves its storage, which changes the owner: the graphs are recaptured (the pool
doubles, so that happens a few times at most). A lab paged layout without `graph_step` runs
eagerly. The graphs share one memory pool (replays never overlap); a replay's logits are valid
until the next forward, the contract `LlamaModel.forward` has.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass

import torch

from slotserver.runtime.batch import Batch

log = logging.getLogger(__name__)

MAX_ROWS = 64          # decode batches of up to this many rows are captured (larger: eager)
MAX_GRAPHS = 160       # at most this many live graphs; the least recently replayed go first
MIN_BUCKET = 256       # the smallest KV bucket (kernels/attention.DECODE_MIN_CHUNK: one split)


def kv_bucket(max_kv: int) -> int:
    """The power of two >= max_kv (at least MIN_BUCKET): decode_splits is constant inside a bucket."""
    return max(MIN_BUCKET, 1 << max(0, int(max_kv) - 1).bit_length())


@dataclass
class _Graph:
    graph: torch.cuda.CUDAGraph
    batch: Batch                 # the captured input tensors (a replay copies into them)
    logits: torch.Tensor         # the captured output [rows, vocab] float32


class CudaGraphs:
    """Captured decode steps of one model on one CUDA device (thread-safe: one step at a time)."""

    def __init__(self, max_rows: int = MAX_ROWS, max_graphs: int = MAX_GRAPHS) -> None:
        self.max_rows, self.max_graphs = max_rows, max_graphs
        self.graphs: dict[tuple, _Graph] = {}
        self.refused: set[tuple] = set()
        self.owner: tuple = ()
        self.pool = None
        self.lock = threading.Lock()
        self.captures = self.replays = 0

    def key(self, batch: Batch, refuse: bool = False) -> tuple | None:
        """(rows, KV bucket) of a decode-only batch this can serve, else None (and None when the
        caller `refuse`s: a layout whose writes a replay would not see)."""
        meta, n = batch.attn, batch.n_tokens
        if refuse or n > self.max_rows or meta.max_q != 1 or meta.split is not None \
                or batch.logits_rows.shape[0] != n or batch.tokens.is_cpu:
            return None
        return n, kv_bucket(meta.max_kv)

    def run(self, owner: tuple, key: tuple, batch: Batch, body: Callable[[Batch], torch.Tensor]) -> torch.Tensor:
        """The step's logits `[rows, vocab]`: replayed, or run eagerly and captured for next time."""
        if not self.lock.acquire(blocking=False):   # another thread's step: run it as usual
            return body(batch)
        try:
            return self._run(owner, key, batch, body)
        finally:
            self.lock.release()

    def _run(self, owner: tuple, key: tuple, batch: Batch, body: Callable[[Batch], torch.Tensor]) -> torch.Tensor:
        if len(owner) != len(self.owner) or not all(map(_same, owner, self.owner)):
            self.clear()
            self.owner = owner
        g = self.graphs.pop(key, None)
        if g is not None:
            self.graphs[key] = g                   # the most recently replayed last
            _copy_inputs(g.batch, batch)
            g.graph.replay()
            self.replays += 1
            return g.logits
        logits = body(batch)                       # the real step, eager (compiles what it meets)
        if key not in self.refused:
            self._capture(key, batch, body)
        return logits

    def _capture(self, key: tuple, batch: Batch, body: Callable[[Batch], torch.Tensor]) -> None:
        """Record body(batch) into a graph (nothing runs); a refusal is remembered for the owner."""
        while len(self.graphs) >= self.max_graphs:
            self.graphs.pop(next(iter(self.graphs)))
        if self.pool is None:
            self.pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        try:
            torch.cuda.synchronize()
            with torch.cuda.graph(graph, pool=self.pool, capture_error_mode="thread_local"):
                logits = body(batch)
        except Exception as e:   # noqa: BLE001 - any capture failure means: this key runs eagerly
            self.refused.add(key)
            log.warning("CUDA graph capture refused for %d rows (context bucket %d), running eagerly: %s",
                        key[0], key[1], str(e).splitlines()[0] if str(e) else type(e).__name__)
            return
        self.graphs[key] = _Graph(graph, batch, logits)
        self.captures += 1

    def clear(self) -> None:
        """Drop every graph (the owner changed: a reload, a swap, a wake, or set_step_graphs)."""
        self.graphs.clear()
        self.refused.clear()
        # and their memory pool: once its last graph is gone, PyTorch frees the private pool, and a
        # capture into the stale handle fails an allocator assert (`use_count > 0`), seen on an H100
        # after the engine's KV moved: every step of that batch size then ran eagerly (15x slower)
        self.pool = None


def _copy_inputs(dst: Batch, src: Batch) -> None:
    """src's tensors into dst's: one copy per distinct base tensor (a decode batch has one)."""
    pairs: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
    for d, s in zip(dst.tensors(), src.tensors()):
        db, sb = _base(d), _base(s)
        if db.shape == sb.shape and d.storage_offset() == s.storage_offset() and d.stride() == s.stride():
            pairs.setdefault(id(db), (db, sb))
        else:
            pairs[id(d)] = (d, s)
    for d, s in pairs.values():
        d.copy_(s, non_blocking=True)


def _same(a, b) -> bool:
    """One owner part unchanged: the same object (kernel set, layout, weights) or the same address."""
    return a is b or (type(a) is int and a == b)


def _base(t: torch.Tensor) -> torch.Tensor:
    return t._base if t._base is not None else t
