"""Stub replicas for the replica router's tests: tiny servers on real ports, in threads.

`StubReplica` speaks enough of slotserver's API for the router (/health, /slots, /metrics, and
/completion + /v1/chat/completions, streamed or not) and records what it was sent, whether each
request's client (the router) went away, and how many chunks it streamed. Test-only body fields
steer it: `stub_chunks` (events to stream), `stub_gap` (seconds between them), `stub_break_after`
(drop the connection after that many events). `BlackHole` accepts a request and closes the
connection without answering: a replica that dies before streaming anything.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from dataclasses import dataclass, field

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, StreamingResponse
from starlette.routing import Route


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Seen:
    path: str
    body: dict
    chunks_sent: int = 0
    client_left: bool = False
    finished: bool = False


class Broken(Exception):
    pass


@dataclass
class StubReplica:
    name: str
    counter: float = 0.0                  # llamacpp:prompt_tokens_total it reports
    healthy: bool = True
    busy: bool = False                    # answer 503 to completions (a full queue), /health still ok
    seen: list[Seen] = field(default_factory=list)
    inflight: int = 0
    lora_scale: float = 1.0

    def app(self) -> Starlette:
        return Starlette(routes=[Route("/health", self.health), Route("/slots", self.slots),
                                 Route("/metrics", self.metrics), Route("/v1/models", self.models),
                                 Route("/completion", self.complete, methods=["POST"]),
                                 Route("/v1/chat/completions", self.complete, methods=["POST"]),
                                 Route("/lora-adapters", self.lora, methods=["GET", "POST"])])

    async def health(self, request: Request):
        if not self.healthy:
            return JSONResponse({"error": {"code": 503, "message": "Loading model"}}, status_code=503)
        return JSONResponse({"status": "ok"})

    async def slots(self, request: Request):
        return JSONResponse([{"id": i, "is_processing": i < self.inflight,
                              "prompt_cache": {"n_cached": 0, "n_computed": len(self.seen)}} for i in range(2)])

    async def models(self, request: Request):
        return JSONResponse({"object": "list", "data": [{"id": "stub", "object": "model"}]})

    async def metrics(self, request: Request):
        return PlainTextResponse(
            "# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed.\n"
            "# TYPE llamacpp:prompt_tokens_total counter\n"
            f"llamacpp:prompt_tokens_total {self.counter}\n"
            "# HELP llamacpp:kv_cache_usage_ratio KV-cache usage.\n# TYPE llamacpp:kv_cache_usage_ratio gauge\n"
            f"llamacpp:kv_cache_usage_ratio {self.counter / 1000}\n"
            "# HELP slotserver_ttft_seconds Time to first token.\n# TYPE slotserver_ttft_seconds histogram\n"
            f'slotserver_ttft_seconds_bucket{{le="0.1"}} 1.0\nslotserver_ttft_seconds_bucket{{le="+Inf"}} 2.0\n'
            f"slotserver_ttft_seconds_sum {self.counter / 100}\nslotserver_ttft_seconds_count 2.0\n"
            "slotserver_ttft_seconds_created 1.7e9\n")

    async def lora(self, request: Request):
        """One adapter: GET lists its scale, POST [{"id": 0, "scale": s}] sets it (any other id: 400)."""
        if request.method == "GET":
            return JSONResponse([{"id": 0, "scale": self.lora_scale}])
        body = await request.json()
        if any(e.get("id") != 0 for e in body):
            return JSONResponse({"error": {"code": 400, "message": "no such LoRA adapter"}}, status_code=400)
        self.lora_scale = next((e["scale"] for e in body), 0.0)
        return JSONResponse({"success": True})

    async def complete(self, request: Request):
        body = await request.json()
        seen = Seen(request.url.path, body)
        self.seen.append(seen)
        if self.busy:
            return JSONResponse({"error": {"code": 503, "message": "queue full"}}, status_code=503)
        if not body.get("stream"):
            return JSONResponse({"content": f"answer from {self.name}", "replica": self.name})
        return StreamingResponse(self._events(seen), media_type="text/event-stream")

    async def _events(self, seen: Seen):
        n, gap = int(seen.body.get("stub_chunks", 3)), float(seen.body.get("stub_gap", 0.0))
        self.inflight += 1
        try:
            for i in range(n):
                if i == seen.body.get("stub_break_after"):
                    raise Broken("the stub replica breaks off mid-stream")
                yield f"data: {json.dumps({'content': f'{self.name}-{i}'})}\n\n".encode()
                seen.chunks_sent += 1
                await asyncio.sleep(gap)
            seen.finished = True
        except (asyncio.CancelledError, GeneratorExit):
            seen.client_left = True
            raise
        finally:
            self.inflight -= 1


class Serving:
    """An ASGI app on a free port in a thread, until stop()."""

    def __init__(self, app, port: int | None = None) -> None:
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="critical", lifespan="on")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError(f"server on {self.url} did not start")
            time.sleep(0.01)

    def stop(self) -> None:
        self.server.should_exit = self.server.force_exit = True
        self.thread.join(10)


class BlackHole:
    """Answers GET /health and /slots; any other request: read, then the connection is closed."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.swallowed = 0
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._one, args=(conn,), daemon=True).start()

    def _one(self, conn: socket.socket) -> None:
        with conn:
            head = conn.recv(65536)
            if head.startswith(b"GET /health") or head.startswith(b"GET /slots"):
                body = b'{"status": "ok"}' if head.startswith(b"GET /health") else b"[]"
                conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nconnection: close\r\n"
                             b"content-length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
            else:
                self.swallowed += 1   # dies before answering

    def close(self) -> None:
        self.sock.close()
