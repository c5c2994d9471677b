"""`WakeGate`: a request to a sleeping server (`--sleep-idle-seconds`) asks the engine to wake,
except on the routes that answer from what sleep keeps (llama-server's read-only set): health,
props, models, slots, metrics, the lab's snapshot and events, and the web page (whose monitor
polls /slots, /lab and /props: watching a sleeping server does not wake it). /metrics then serves the
snapshot taken on entering sleep, and polling /props does not wake the model it reports on.

A woken request goes on at once; the engine reloads at its next step boundary, before it handles
any message, so a generation waits for the weights and a tokenizer route never needs them.
"""

from __future__ import annotations

from typing import Callable

from starlette.types import ASGIApp, Receive, Scope, Send

from slotserver.server.asgi_http import HttpMiddleware

READ_ONLY = frozenset({"/", "/health", "/v1/health", "/props", "/models", "/v1/models", "/metrics", "/slots",
                       "/lab", "/lab/events"})
READ_ONLY_PREFIXES = ("/v1/models/", "/webui/")   # a model's description; the web page's files


class WakeGate(HttpMiddleware):
    def __init__(self, app: ASGIApp, engine: Callable[[], object]) -> None:
        super().__init__(app)
        self.engine = engine

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        engine = self.engine()
        sleeper = getattr(engine, "sleeper", None)
        if sleeper is not None and sleeper.asleep and not _read_only(scope):
            sleeper.request_wake()
        await self.app(scope, receive, send)


def _read_only(scope: Scope) -> bool:
    path = scope["path"]
    return scope["method"] in ("GET", "HEAD") and (path in READ_ONLY or path.startswith(READ_ONLY_PREFIXES))
