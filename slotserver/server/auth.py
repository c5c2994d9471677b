"""The serving server's API-key middleware; the rules are access/api_keys.py's.

A refusal on the Anthropic routes (/v1/messages...) is in Anthropic's error shape
(anthropic/errors.py), elsewhere in llama-server's. Besides access/api_keys.py's public paths,
the web page's static files (`/`, `/webui/*`: no data; the page sends the key the user types)
need no key; every other route does, the lab's (/lab, /lab/*) included.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Receive, Scope, Send

from slotserver.access.api_keys import PUBLIC_PATHS, refused
from slotserver.server.anthropic.errors import error_response, is_anthropic_path
from slotserver.server.errors import ApiError

# the web page (routes/webui.py): static files holding no data; the page asks for the key itself
PUBLIC = PUBLIC_PATHS | {"/"}
PUBLIC_PREFIXES = ("/webui/",)


class ApiKeyAuth:
    """ASGI middleware; a no-op when no key is configured."""

    def __init__(self, app: ASGIApp, keys: tuple[str, ...]) -> None:
        self.app, self.keys = app, tuple(keys)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if refused(scope, self.keys, PUBLIC, PUBLIC_PREFIXES):
            err = ApiError(401, "Invalid API Key", "authentication_error")
            answer = error_response(err) if is_anthropic_path(scope["path"]) else err.response()
            await answer(scope, receive, send)
            return
        await self.app(scope, receive, send)
