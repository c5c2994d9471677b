"""Events of one engine step, handed to each asyncio loop in a single wake-up.

Why: a step of 32 decodes emits 32 token events. Delivering each with its own
`loop.call_soon_threadsafe` wakes the server's event loop (a write to its self-pipe) up to 32 times
per step, and each wake-up makes the loop thread compete with the engine thread for the GIL and
with torch's threads for the cores while the next step is already running. Batched, the loop wakes
once per step and delivers all events in one callback, in emission order.

The engine owns one outbox: handles with an event loop `put` into it on the engine thread, and the
engine `flush`es it at the end of every step (also a step that only handled cancellations).
Handles without a loop (thread consumers) never use it.
"""

from __future__ import annotations

import asyncio


class Outbox:
    def __init__(self) -> None:
        self._pending: list[tuple[asyncio.AbstractEventLoop, asyncio.Queue, object]] = []

    def put(self, loop: asyncio.AbstractEventLoop, queue: asyncio.Queue, event: object) -> None:
        """Called on the engine thread; delivered at the next `flush`."""
        self._pending.append((loop, queue, event))

    def __len__(self) -> int:
        return len(self._pending)

    def flush(self) -> None:
        """Deliver everything put so far: one `call_soon_threadsafe` per event loop."""
        if not self._pending:
            return
        by_loop: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Queue, object]]] = {}
        for loop, queue, event in self._pending:
            by_loop.setdefault(loop, []).append((queue, event))
        self._pending = []
        for loop, items in by_loop.items():
            try:
                loop.call_soon_threadsafe(_deliver, items)
            except RuntimeError:  # the loop is closed: its clients are gone
                pass


def _deliver(items: list[tuple[asyncio.Queue, object]]) -> None:
    for queue, event in items:
        queue.put_nowait(event)
