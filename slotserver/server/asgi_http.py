"""What the server's own ASGI middlewares share: pass non-HTTP scopes through, and see a
response's status as it starts.

Starlette's `BaseHTTPMiddleware` would do both, but it buffers nothing well for streams and runs
the app in a separate task; these are the few lines pure ASGI needs.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send



class HttpMiddleware:
    """Base class: lifespan and websocket scopes go straight to the app; `handle` gets HTTP ones."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        await self.handle(scope, receive, send)

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        raise NotImplementedError


class StatusRecorder:
    """Wraps `send`; `status` is the response's status once it started (0 before)."""

    def __init__(self, send: Send) -> None:
        self._send, self.status = send, 0

    async def __call__(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self.status = message["status"]
        await self._send(message)
