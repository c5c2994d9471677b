"""Events of one engine step, handed to each asyncio loop in a single wake-up, or fewer.

Why: a step of 32 decodes emits 32 token events. Delivering each with its own
`loop.call_soon_threadsafe` wakes the server's event loop (a write to its self-pipe) up to 32 times
per step, and each wake-up makes the loop thread compete with the engine thread for the GIL and
with torch's threads for the cores while the next step is already running. Batched, the loop wakes
once per step and delivers all events in one callback, in emission order.

Why a mailbox per loop: when the event loop falls behind the engine (a GPU step of 64 decodes in
~1.6 ms against the loop's ~3 ms of per-token HTTP work, docs/gpu.md), a wake-up per step would
queue one callback per step, each delivered after the previous one's stream writes: the loop would
never catch up, and every step would still cost the engine a self-pipe write. Instead a step's
events go into the loop's mailbox, and a wake-up is scheduled only when the mailbox was empty (the
loop had taken everything before). A loop that is behind takes several steps' events in one
callback; a stream then finds several events in its queue and its response sends them together
(server/sse.py). Nothing waits: the first event of an empty mailbox is scheduled at once.

The engine owns one outbox: handles with an event loop `put` into it on the engine thread, and the
engine `flush`es it at the end of every step (also a step that only handled cancellations).
Handles without a loop (thread consumers) never use it.
"""

from __future__ import annotations

import asyncio
import threading
import weakref


class Mailbox:
    """One event loop's undelivered events; `deliver` runs on that loop."""

    def __init__(self) -> None:
        self.items: list[tuple[asyncio.Queue, object]] = []
        self.lock = threading.Lock()
        self.wakeups = 0   # callbacks scheduled (tests: fewer than flushes when coalesced)

    def post(self, loop: asyncio.AbstractEventLoop, items: list[tuple[asyncio.Queue, object]]) -> None:
        """Engine thread: add a step's events; wake the loop unless a wake-up is already pending."""
        with self.lock:
            idle = not self.items
            self.items.extend(items)
        if idle:
            self.wakeups += 1
            try:
                loop.call_soon_threadsafe(self.deliver)
            except RuntimeError:  # the loop is closed: its clients are gone
                with self.lock:
                    self.items.clear()

    def deliver(self) -> None:
        """Event loop: every event posted so far, into its queue, in emission order."""
        with self.lock:
            items, self.items = self.items, []
        for queue, event in items:
            queue.put_nowait(event)


class Outbox:
    def __init__(self) -> None:
        self._pending: list[tuple[asyncio.AbstractEventLoop, asyncio.Queue, object]] = []
        # by loop, weakly: a loop that is gone (a test's, a restarted server's) takes its mailbox along
        self._boxes: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Mailbox] = weakref.WeakKeyDictionary()

    def put(self, loop: asyncio.AbstractEventLoop, queue: asyncio.Queue, event: object) -> None:
        """Called on the engine thread; delivered at the next `flush`."""
        self._pending.append((loop, queue, event))

    def __len__(self) -> int:
        return len(self._pending)

    def mailbox(self, loop: asyncio.AbstractEventLoop) -> Mailbox:
        box = self._boxes.get(loop)
        if box is None:
            box = self._boxes[loop] = Mailbox()
        return box

    def flush(self) -> None:
        """Post everything put so far: at most one pending wake-up per event loop."""
        if not self._pending:
            return
        by_loop: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Queue, object]]] = {}
        for loop, queue, event in self._pending:
            by_loop.setdefault(loop, []).append((queue, event))
        self._pending = []
        for loop, items in by_loop.items():
            self.mailbox(loop).post(loop, items)
