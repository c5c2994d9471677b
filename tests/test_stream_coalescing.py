"""An event loop behind the engine takes several steps' events in one wake-up and sends a stream's
backlog in one write; a loop that keeps up sends every token in its own write as soon as the step
that made it ends (engine/outbox.py, server/sse.py "Coalescing")."""

from __future__ import annotations

import asyncio
import threading

from slotserver.engine.outbox import Outbox
from slotserver.engine.request import ErrorEvent, RequestHandle, TokenEvent
from slotserver.server.sse import EventStreamResponse


async def _never_disconnects():
    await asyncio.Event().wait()
    return {"type": "http.disconnect"}


def _chunks(handle: RequestHandle):
    async def gen():
        async for ev in handle.events():
            yield (ev.text if isinstance(ev, TokenEvent) else "end").encode() + b"\n"
    return gen()


def _token(i: int) -> TokenEvent:
    return TokenEvent(token=i, text=f"t{i}")


def test_a_backlog_of_steps_reaches_the_loop_in_one_wake_up_and_the_client_in_one_write():
    async def main():
        loop, outbox = asyncio.get_running_loop(), Outbox()
        handle = RequestHandle(1, None, None, loop, outbox)
        for i in range(3):   # three engine steps end before the loop gets to run
            handle.emit(_token(i))
            outbox.flush()
        handle.emit(ErrorEvent("stop"))
        outbox.flush()
        bodies = []

        async def send(message):
            if message["type"] == "http.response.body":
                bodies.append(message["body"])

        response = EventStreamResponse(_chunks(handle)).gather_from(handle)
        await asyncio.wait_for(response({"type": "http"}, _never_disconnects, send), timeout=10)
        return bodies, outbox.mailbox(loop).wakeups

    bodies, wakeups = asyncio.run(main())
    assert bodies == [b"t0\nt1\nt2\nend\n", b""]
    assert wakeups == 1


def test_a_loop_that_keeps_up_sends_each_step_token_before_the_next_step_ends():
    """The 'engine' thread ends its next step only after the client got the last token: a chunk
    held back for later would deadlock this (the wait_for fails the test instead)."""
    async def main():
        loop, outbox = asyncio.get_running_loop(), Outbox()
        handle = RequestHandle(1, None, None, loop, outbox)
        received = threading.Semaphore(0)
        bodies = []

        async def send(message):
            if message["type"] == "http.response.body":
                bodies.append(message["body"])
                received.release()

        def engine():
            for i in range(4):
                handle.emit(_token(i))
                outbox.flush()
                assert received.acquire(timeout=5), f"token {i} was not sent"
            handle.emit(ErrorEvent("stop"))
            outbox.flush()

        thread = threading.Thread(target=engine)
        thread.start()
        response = EventStreamResponse(_chunks(handle)).gather_from(handle)
        await asyncio.wait_for(response({"type": "http"}, _never_disconnects, send), timeout=10)
        thread.join()
        return bodies, outbox.mailbox(loop).wakeups

    bodies, wakeups = asyncio.run(main())
    assert bodies == [b"t0\n", b"t1\n", b"t2\n", b"t3\n", b"end\n", b""]
    assert wakeups == 5
