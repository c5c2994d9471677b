"""One log line per request: method, path, status, tokens (prompt+generated), milliseconds.

uvicorn's access log is off; this middleware writes the line when the response is complete, so
a stream is logged once, with its final token counts (set by the route in `scope["state"]`).
A client that left before its answer shows status 499 (nginx's "client closed request").
"""

from __future__ import annotations

import logging
import time

from starlette.types import ASGIApp, Message, Receive, Scope, Send

log = logging.getLogger("slotserver.http")


class AccessLog:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        t0 = time.perf_counter()
        status = [0]
        info = scope.setdefault("state", {})

        async def recording_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, recording_send)
        finally:
            ms = (time.perf_counter() - t0) * 1000
            tokens = info.get("tokens")
            tok = f"{tokens[0]}+{tokens[1]} tok" if tokens else "- tok"
            log.info("%s %s %d %s %.0f ms", scope["method"], scope["path"], status[0] or 500, tok, ms)

