"""GET /models/sse: llama-server's router events, one `data: {json}` per state change.

    {"model": NAME, "event": "model_status", "data": {"status": "loading" | "loaded" | "unloaded"}}
    {"model": NAME, "event": "model_remove"}            a reload dropped the model
    {"model": "*", "event": "models_reload"}            the list was read again

A subscriber's queue is bounded; one that falls that far behind loses its oldest events rather
than holding the router's memory.
"""

from __future__ import annotations

import asyncio
import json
from typing import AsyncIterator

MAX_PENDING = 256


class Events:
    def __init__(self) -> None:
        self.subscribers: set[asyncio.Queue] = set()

    def publish(self, event: str, model: str, data: dict | None = None) -> None:
        message = {"model": model, "event": event, **({"data": data} if data is not None else {})}
        for queue in self.subscribers:
            if queue.full():
                queue.get_nowait()
            queue.put_nowait(message)

    async def stream(self) -> AsyncIterator[bytes]:
        queue: asyncio.Queue = asyncio.Queue(MAX_PENDING)
        self.subscribers.add(queue)
        try:
            yield b": connected\n\n"   # the response is open: the client is subscribed
            while True:
                message = await queue.get()
                yield f"data: {json.dumps(message)}\n\n".encode()
        finally:
            self.subscribers.discard(queue)
