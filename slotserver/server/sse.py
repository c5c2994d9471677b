"""Server-sent events: llama-server's framing and a response that notices a client leaving.

Framing: every event is one line `data: <json>` followed by a blank line. The OpenAI routes end
with `data: [DONE]`; llama-server's /completion does not.

`EventStreamResponse` sends the chunks of an async iterator while a second task listens for
`http.disconnect`. Whichever happens first ends the stream: the producer finishing, the client
leaving (even while no token is being produced, e.g. during a long prefill or in the queue), a
failed send, or one send waiting `write_timeout` seconds (the client stopped reading). In every
case `on_close` runs, which is where the engine request is cancelled, so an abandoned stream frees
its slot at the next step.

Pings (`ping_interval` > 0, llama-server's `sse_ping_interval`, default 30 s): whenever nothing
has been sent for that many seconds (a long prefill, a queue, a slow model), the stream sends
`:\n\n`, an SSE comment every client ignores, as llama-server does: clients and proxies that drop
a silent connection (undici's body timeout, nginx's proxy_read_timeout) keep it. A fourth task,
sharing the send lock with the producer so that a ping never lands inside a chunk.

The write timeout is a third task that sleeps until the current send's deadline, not a timer per
chunk: `anyio.fail_after` around each send made and cancelled a cancel scope and a loop timer per
streamed token (with choices.merged's direct path for one run, the event loop's Python calls per
token at 32 streams fell from ~300 to ~180, docs/performance.md).

Coalescing (`gather_from`): a response fed by one engine request gathers the chunks of the events
already queued and sends them as one body message when the request's handle is about to wait for
the engine (`RequestHandle.before_wait`). A client that keeps up sees nothing different, one send
per token, since each step's event finds an empty queue behind it; an event loop that has fallen
behind the engine (engine/outbox.py hands it several steps' events at once) sends a stream's
backlog in one write instead of one per token, so the per-send work (the middlewares' send
wrappers, HTTP framing, the socket syscall) shrinks exactly when it is the bottleneck. No chunk
waits for a later event: the flush runs before any wait.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, AsyncIterator, Callable

import anyio
from starlette.types import Receive, Scope, Send

from slotserver.server.jsonio import dumps

log = logging.getLogger("slotserver.http")

DONE = b"data: [DONE]\n\n"
PING = b":\n\n"   # llama-server's ping: an empty SSE comment
HEADERS = [
    (b"content-type", b"text/event-stream"),
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),
]


def event(obj: Any) -> bytes:
    """One SSE event holding `obj` as compact JSON."""
    return b"data: " + dumps(obj) + b"\n\n"


def comment(text: str) -> bytes:
    """An SSE comment (ignored by clients; keeps idle connections alive)."""
    return b": " + text.encode() + b"\n\n"


async def wait_for_disconnect(receive: Receive) -> None:
    """Returns when the client has gone (the request body must already have been read)."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return


class EventStreamResponse:
    def __init__(self, chunks: AsyncIterator[bytes], on_close: Callable[[], None] = lambda: None,
                 write_timeout: float = 600.0, headers: dict[str, str] | None = None, ping_interval: float = -1) -> None:
        self.chunks = chunks
        self.on_close = on_close
        self.write_timeout = write_timeout
        self.ping_interval = ping_interval   # seconds of silence before a ping; <= 0: none
        self._last_send = time.monotonic()
        # asyncio's lock: taking a free one does not yield to the loop (anyio's checkpoints twice), and
        # a send a token is the hot path (see "Coalescing" above)
        self._lock = asyncio.Lock()
        self.extra = [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
        self.client_gone = False
        self._send_started: float | None = None   # time.monotonic() when the pending send began
        self._send: Send | None = None
        self._gathered: list[bytes] | None = None  # coalescing: chunks not sent yet (gather_from)

    def gather_from(self, handle) -> "EventStreamResponse":
        """Coalesce the chunks of `handle`'s queued events (see the module docstring). `handle` must
        be the only source of events behind `chunks` (one engine request: not n > 1's merge)."""
        self._gathered = []
        handle.before_wait = self.flush
        return self

    async def flush(self) -> None:
        """Send the gathered chunks as one body message (nothing if none)."""
        gathered, send = self._gathered, self._send
        if not gathered or send is None:
            return
        body = gathered[0] if len(gathered) == 1 else b"".join(gathered)
        gathered.clear()
        await self._send_body(send, body)

    async def _send_body(self, send: Send, body: bytes) -> None:
        async with self._lock:
            await self._write(send, body)

    async def _write(self, send: Send, body: bytes, more: bool = True) -> None:
        """One body message, the lock held: timed for the write deadline, and as the last send for pings."""
        self._send_started = time.monotonic()
        await send({"type": "http.response.body", "body": body, "more_body": more})
        self._send_started, self._last_send = None, time.monotonic()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await send({"type": "http.response.start", "status": 200, "headers": HEADERS + self.extra})
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._watch, receive, tg.cancel_scope)
                tg.start_soon(self._write_deadline, tg.cancel_scope)
                if self.ping_interval > 0:
                    tg.start_soon(self._pings, send)
                await self._produce(send)
                tg.cancel_scope.cancel()
        finally:
            self.on_close()
            aclose = getattr(self.chunks, "aclose", None)
            if aclose is not None:
                with anyio.CancelScope(shield=True):
                    await aclose()

    async def _watch(self, receive: Receive, scope: anyio.CancelScope) -> None:
        await wait_for_disconnect(receive)
        self.client_gone = True
        scope.cancel()

    async def _write_deadline(self, scope: anyio.CancelScope) -> None:
        """Ends the stream once a single send has waited `write_timeout` seconds."""
        while True:
            started = self._send_started
            now = time.monotonic()
            if started is not None and now - started >= self.write_timeout:
                log.info("stream ended early: the client read nothing for %g s", self.write_timeout)
                self.client_gone = True
                scope.cancel()
                return
            await anyio.sleep(max(self.write_timeout - (now - started if started is not None else 0.0), 0.01))

    async def _pings(self, send: Send) -> None:
        """A ping whenever the stream has been silent for `ping_interval` seconds."""
        self._last_send = time.monotonic()
        while True:
            await anyio.sleep(max(self._last_send + self.ping_interval - time.monotonic(), 0.01))
            async with self._lock:
                if self.ping_interval <= 0:
                    return
                if time.monotonic() - self._last_send >= self.ping_interval:
                    try:
                        await self._write(send, PING)
                    except OSError:   # the client is gone: the producer's next send or the watcher ends the stream
                        return

    async def _produce(self, send: Send) -> None:
        self._send = send
        try:
            async for chunk in self.chunks:
                if self._gathered is not None:
                    self._gathered.append(chunk)
                else:
                    await self._send_body(send, chunk)
            await self.flush()
            async with self._lock:
                await self._write(send, b"", more=False)
                self.ping_interval = -1   # the body is complete: no ping after it
        except OSError as e:  # the client is gone
            log.info("stream ended early: %s", type(e).__name__)
            self.client_gone = True
