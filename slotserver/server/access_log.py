"""One log line per request: method, path, status, tokens (prompt+generated), milliseconds.

uvicorn's access log is off; this middleware writes the line when the response is complete, so
a stream is logged once, with its final token counts (set by the route in `scope["state"]`).
A client that left before its answer shows status 499 (nginx's "client closed request").
"""

from __future__ import annotations

import logging
import time

from starlette.types import Receive, Scope, Send

from slotserver.server.asgi_http import HttpMiddleware, StatusRecorder

log = logging.getLogger("slotserver.http")


class AccessLog(HttpMiddleware):
    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        t0 = time.perf_counter()
        recorder = StatusRecorder(send)
        info = scope.setdefault("state", {})
        try:
            await self.app(scope, receive, recorder)
        finally:
            ms = (time.perf_counter() - t0) * 1000
            tokens = info.get("tokens")
            tok = f"{tokens[0]}+{tokens[1]} tok" if tokens else "- tok"
            log.info("%s %s %d %s %.0f ms", scope["method"], scope["path"], recorder.status or 500, tok, ms)

