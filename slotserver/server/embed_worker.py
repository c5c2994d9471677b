"""The embedding server's one compute thread: requests queue up, and whatever is waiting runs together.

An embedding-only server has no slot engine: a request is a list of token sequences, computed in
one go (no KV cache, nothing kept between requests). Routes call `await worker.embed(seqs)` from
the event loop; the sequences go into a queue, and the model thread (the one that loaded the
model, launch.py's `ModelThread`) takes every job waiting, up to `max_batch_tokens` tokens, and
runs all their sequences through `Embedder.run` together, which batches them by length. So 32
concurrent single-text requests cost about what one 32-text request costs.

Why one thread rather than `anyio.to_thread` plus a lock: torch's OpenMP keeps a thread team per
thread that runs parallel ops, and more teams than cores made every op several times slower
(docs/architecture.md, "Two things learned the hard way"); the anyio pool has many threads. One
thread also serializes the forwards, which is what the lock would do.

A job whose client left (its future cancelled) is skipped. An exception in a forward fails the
jobs of that batch only; the thread keeps serving.
"""

from __future__ import annotations

import asyncio
import logging
import queue
from dataclasses import dataclass

import torch

from slotserver.model.encoder.embedder import Embedder
from slotserver.server.embed_config import EmbeddingConfig

log = logging.getLogger("slotserver.embed")
_STOP = object()


@dataclass
class _Job:
    seqs: list[list[int]]
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future

    @property
    def n_tokens(self) -> int:
        return sum(map(len, self.seqs))

    def settle(self, result: list[torch.Tensor] | None = None, error: BaseException | None = None) -> None:
        """Resolve the future on its loop's thread (from the worker thread)."""
        def apply() -> None:
            if self.future.done():      # cancelled meanwhile: the client left
                return
            if error is not None:
                self.future.set_exception(error)
            else:
                self.future.set_result(result)
        self.loop.call_soon_threadsafe(apply)


class EmbedWorker:
    """Owns the loaded `Embedder`; `embed` from the event loop, `run` on the model thread."""

    def __init__(self, embedder: Embedder, config: EmbeddingConfig) -> None:
        self.embedder, self.config = embedder, config
        self.max_tokens = config.max_tokens(embedder.ctx_train)
        self._queue: queue.SimpleQueue = queue.SimpleQueue()

    async def embed(self, seqs: list[list[int]]) -> list[torch.Tensor]:
        """Pooled vectors of `seqs` (see Embedder.run), computed on the model thread."""
        loop = asyncio.get_running_loop()
        job = _Job(seqs, loop, loop.create_future())
        self._queue.put(job)
        return await job.future

    def run(self, watch: bool = False) -> None:
        """Serve jobs until `stop()` (the model thread's loop; `watch` is the engine's, unused here)."""
        while True:
            first = self._queue.get()
            if first is _STOP:
                return
            jobs, stop = self._gather(first)
            jobs = [j for j in jobs if not j.future.cancelled()]
            if jobs:
                self._compute(jobs)
            if stop:
                return

    def stop(self) -> None:
        self._queue.put(_STOP)

    def _gather(self, first: _Job) -> tuple[list[_Job], bool]:
        """`first` and the jobs waiting behind it, up to max_batch_tokens tokens (at least one job)."""
        jobs, total = [first], first.n_tokens
        while total < self.config.max_batch_tokens:
            try:
                job = self._queue.get_nowait()
            except queue.Empty:
                break
            if job is _STOP:
                return jobs, True
            jobs.append(job)
            total += job.n_tokens
        return jobs, False

    def _compute(self, jobs: list[_Job]) -> None:
        seqs = [s for j in jobs for s in j.seqs]
        try:
            vectors = self.embedder.run(seqs)
        except Exception as e:  # noqa: BLE001 - reported to each waiting request, the thread goes on
            log.exception("embedding batch of %d sequences failed", len(seqs))
            for j in jobs:
                j.settle(error=e)
            return
        start = 0
        for j in jobs:
            j.settle(vectors[start: start + len(j.seqs)])
            start += len(j.seqs)
