"""Forwarding one request to a model's child, streamed both ways through httpx.

Nothing is buffered: the child's bytes go to the client as they come (SSE tokens stay live), and
the request is counted on its model (`ModelRouter.acquire`/`release`) until the last byte or the
client's departure. A client that leaves is passed on: while the child computes a non-streamed
answer the router polls the client and cancels the upstream request, and during a stream starlette
stops the body iterator, which closes the upstream response; either way the child sees its client
gone and frees the slot, as it would for a direct client.
"""

from __future__ import annotations

import asyncio
from typing import Callable

import httpx
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from slotserver.router.errors import RouterError

# not passed on: hop-by-hop headers, and the client's key, which the router checked (the child
# gets the router's own key for it, child.py)
HOP_BY_HOP = {"authorization", "x-api-key", "host", "connection", "keep-alive", "proxy-authenticate",
              "proxy-authorization", "te", "trailer", "trailers", "transfer-encoding", "upgrade", "content-length"}
DISCONNECT_POLL_S = 0.25


def _headers(items) -> list[tuple[str, str]]:
    return [(k, v) for k, v in items if k.lower() not in HOP_BY_HOP]


async def forward(client: httpx.AsyncClient, request: Request, base_url: str, auth: dict[str, str], body: bytes,
                  done: Callable[[], None]) -> Response:
    """The child's answer to `request` (method, path, query, headers, `body`); `done()` runs once,
    when the answer is over, failed, or its client left."""
    url = base_url + request.url.path + (f"?{request.url.query}" if request.url.query else "")
    headers = _headers(request.headers.items()) + list(auth.items())
    upstream = client.build_request(request.method, url, headers=headers, content=body)
    sending = asyncio.ensure_future(client.send(upstream, stream=True))
    try:
        while not (await asyncio.wait({sending}, timeout=DISCONNECT_POLL_S))[0]:
            if await request.is_disconnected():
                sending.cancel()
                raise RouterError(400, "client disconnected")
        answer = sending.result()
    except httpx.HTTPError as e:
        done()
        raise RouterError(502, f"the model's server did not answer: {e}") from None
    except BaseException:
        done()
        raise

    async def body_iter():
        try:
            async for chunk in answer.aiter_raw():
                yield chunk
        finally:
            await answer.aclose()
            done()

    return StreamingResponse(body_iter(), status_code=answer.status_code,
                             headers=dict(_headers(answer.headers.multi_items())))
