"""Forwarding one request to a replica: streamed through, retried only while nothing was sent.

Raw ASGI rather than a starlette Response because the order matters: the router reads the
upstream's status, headers AND first body chunk before it sends anything to the client. Until then
a replica that fails (refused connection, reset, timeout, a 503 "busy/loading" answer) costs the
client nothing: the request goes to the next replica (at most `retries` others). Once the first byte
went out, a failure cannot be hidden: the client's connection is closed mid-answer (a truncated
chunked body, which every HTTP client reports), never a second, different answer spliced in.

Streaming: every chunk the upstream sends (`aiter_raw`, no decoding, no buffering) is sent on at
once, so server-sent events arrive token by token. A client that disconnects cancels the forward
task, whose `finally` closes the upstream response: its connection is dropped, which is how the
replica learns that its client left (slotserver and llama-server then cancel the generation).
"""

from __future__ import annotations

import asyncio
import json
import logging

import httpx

from slotserver.replicas.policy import Decision

log = logging.getLogger("slotserver.replicas")

HOP_BY_HOP = {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer",
              "transfer-encoding", "upgrade", "host", "content-length"}
# any failure to talk to the replica (refused, reset, timed out, a broken HTTP answer): the replica,
# not the request, is at fault, so another replica may answer it
RETRY_ERRORS = (httpx.TransportError,)


class PayloadTooLarge(Exception):
    pass


async def read_body(receive, limit: int) -> bytes:
    chunks, size = [], 0
    while True:
        msg = await receive()
        if msg["type"] == "http.disconnect":
            raise asyncio.CancelledError
        chunk = msg.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise PayloadTooLarge
        chunks.append(chunk)
        if not msg.get("more_body"):
            return b"".join(chunks)


def error_body(code: int, message: str, kind: str) -> bytes:
    """llama-server's error shape."""
    return json.dumps({"error": {"code": code, "message": message, "type": kind}}).encode()


async def send_json(send, status: int, body: bytes) -> None:
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


def upstream_request(client: httpx.AsyncClient, scope, url: str, body: bytes) -> httpx.Request:
    headers = [(k, v) for k, v in scope["headers"] if k.decode("latin-1").lower() not in HOP_BY_HOP]
    if scope.get("client"):
        headers.append((b"x-forwarded-for", scope["client"][0].encode()))
    target = url + scope.get("raw_path", scope["path"].encode()).decode("latin-1")
    if scope.get("query_string"):
        target += "?" + scope["query_string"].decode("latin-1")
    return client.build_request(scope["method"], target, headers=headers, content=body)


class Attempt:
    """One try on one replica: open it, hold its first chunk, then pump the rest to the client."""

    def __init__(self, client: httpx.AsyncClient, decision: Decision) -> None:
        self.client, self.decision = client, decision
        self.resp: httpx.Response | None = None
        self.chunks = None
        self.first = b""
        self.done = False

    async def open(self, request: httpx.Request) -> int:
        """Send the request and read up to the first body chunk; raises RETRY_ERRORS on failure."""
        self.resp = await self.client.send(request, stream=True)
        self.chunks = self.resp.aiter_raw()
        try:
            self.first = await self.chunks.__anext__()
        except StopAsyncIteration:
            self.done = True
        return self.resp.status_code

    async def pump(self, send) -> bool:
        """Send the held status, headers and chunk, then the rest as it comes. False when the
        upstream broke off mid-answer (the client's connection must then be closed unfinished)."""
        resp = self.resp
        drop = HOP_BY_HOP - {"content-length"}   # the raw bytes go through: the upstream's length holds
        headers = [(k.lower(), v) for k, v in resp.headers.raw if k.decode("latin-1").lower() not in drop]
        headers.append((b"x-slotserver-replica", self.decision.replica.name.encode()))
        await send({"type": "http.response.start", "status": resp.status_code, "headers": headers})
        await send({"type": "http.response.body", "body": self.first, "more_body": not self.done})
        if self.done:
            return True
        try:
            async for chunk in self.chunks:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
        except httpx.HTTPError as e:
            log.warning("replica %s broke off mid-answer (%s): the client's answer is cut",
                        self.decision.replica.url, type(e).__name__)
            return False
        await send({"type": "http.response.body", "body": b"", "more_body": False})
        return True

    async def close(self) -> None:
        if self.resp is not None:
            await self.resp.aclose()   # unread body: the connection is dropped, the replica sees its client go
