"""A streamed response ends, and frees its request, when the client stops reading for the write
timeout; a client that reads slowly but keeps reading gets every event (the timeout is per send,
not per stream)."""

from __future__ import annotations

import asyncio
import time

from slotserver.server.sse import EventStreamResponse


async def _chunks(n: int):
    for i in range(n):
        yield f"data: {i}\n\n".encode()


async def _never_disconnects():
    await asyncio.Event().wait()
    return {"type": "http.disconnect"}


def _serve(response: EventStreamResponse, send) -> float:
    t = time.monotonic()
    asyncio.run(asyncio.wait_for(response({"type": "http"}, _never_disconnects, send), timeout=10))
    return time.monotonic() - t


def test_a_client_that_stops_reading_is_dropped_after_the_write_timeout():
    closed, bodies = [], []

    async def send(message):
        if message["type"] == "http.response.body":
            if len(bodies) == 3:   # the client's buffers are full: this send never completes
                await asyncio.Event().wait()
            bodies.append(message["body"])

    response = EventStreamResponse(_chunks(100), on_close=lambda: closed.append(True), write_timeout=0.3)
    took = _serve(response, send)
    assert closed == [True] and response.client_gone
    assert bodies == [b"data: 0\n\n", b"data: 1\n\n", b"data: 2\n\n"]
    assert 0.3 <= took < 3.0


def test_a_slow_reader_that_keeps_reading_gets_the_whole_stream():
    closed, bodies = [], []

    async def send(message):
        if message["type"] == "http.response.body":
            await asyncio.sleep(0.05)   # each send waits, 20 of them outlast the write timeout together
            bodies.append(message["body"])

    response = EventStreamResponse(_chunks(20), on_close=lambda: closed.append(True), write_timeout=0.3)
    _serve(response, send)
    assert closed == [True] and not response.client_gone
    assert bodies == [f"data: {i}\n\n".encode() for i in range(20)] + [b""]


async def _slow_chunks():
    yield b"data: 0\n\n"
    await asyncio.sleep(0.75)   # a long prefill, a queue: nothing to send
    yield b"data: 1\n\n"


def test_a_silent_stream_sends_llama_servers_ping_and_a_busy_one_none():
    bodies = []

    async def send(message):
        if message["type"] == "http.response.body":
            bodies.append(message["body"])

    _serve(EventStreamResponse(_slow_chunks(), ping_interval=0.3), send)
    assert bodies[0] == b"data: 0\n\n" and bodies[-2:] == [b"data: 1\n\n", b""]
    assert bodies[1:-2] and set(bodies[1:-2]) == {b":\n\n"}   # one each 0.3 s of the 0.75 s of silence (2, unless the host is slow)
    bodies.clear()
    _serve(EventStreamResponse(_slow_chunks(), ping_interval=-1), send)
    assert bodies == [b"data: 0\n\n", b"data: 1\n\n", b""]
    bodies.clear()
    _serve(EventStreamResponse(_chunks(5), ping_interval=0.3), send)   # done before a ping is due
    assert bodies == [f"data: {i}\n\n".encode() for i in range(5)] + [b""]
