"""The router's API-key middleware; the rules are access/api_keys.py's, as the serving server's.

The key is checked here and not passed on: children listen on loopback without one.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Receive, Scope, Send

from slotserver.access.api_keys import refused
from slotserver.router.errors import RouterError


class RouterAuth:
    def __init__(self, app: ASGIApp, keys: tuple[str, ...]) -> None:
        self.app, self.keys = app, tuple(keys)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if refused(scope, self.keys):
            await RouterError(401, "Invalid API Key", "authentication_error").response()(scope, receive, send)
            return
        await self.app(scope, receive, send)
