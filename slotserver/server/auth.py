"""API keys (`--api-key`, `--api-key-file`): `Authorization: Bearer KEY` or `X-Api-Key: KEY`.

`X-Api-Key` is how Anthropic's clients send their key (llama-server reads it when there is no
Authorization header); a request passes when either header holds a valid key, so a proxy's own
Authorization header does not hide the client's X-Api-Key. A refusal on the Anthropic routes
(/v1/messages...) is in Anthropic's error shape (anthropic/errors.py), elsewhere in llama-server's.

As in llama-server, /health, /v1/health, /models and /v1/models stay public (health checks and
model discovery), and CORS preflight requests pass; so do the web page's static files (`/`,
`/webui/*`: no data; the page sends the key the user types); every other route needs a key, the lab's
(/lab, /lab/*) included. Keys are compared with
`hmac.compare_digest` against every configured key, so timing does not reveal a key's prefix.
"""

from __future__ import annotations

import hmac
from pathlib import Path

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from slotserver.model.config import ConfigError
from slotserver.server.anthropic.errors import error_response, is_anthropic_path
from slotserver.server.errors import ApiError

PUBLIC_PATHS = frozenset({"/health", "/v1/health", "/models", "/v1/models"})
# the web page (routes/webui.py): static files holding no data; the page asks for the key itself
PUBLIC_WEBUI = ("/", "/webui/")


def read_key_file(path: Path) -> list[str]:
    """One key per line; blank lines and surrounding whitespace are ignored."""
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"--api-key-file {path}: {e.strerror if isinstance(e, OSError) else e}") from None
    keys = [line.strip() for line in lines if line.strip()]
    if not keys:
        raise ConfigError(f"--api-key-file {path} holds no key")
    return keys


def presented_keys(headers: Headers) -> list[str]:
    """The keys a request presents: the Authorization header's bearer token, then X-Api-Key."""
    keys = []
    auth = headers.get("authorization", "")
    if auth[:7].lower() == "bearer ":
        keys.append(auth[7:].strip())
    if headers.get("x-api-key") is not None:
        keys.append(headers["x-api-key"])
    return keys


def key_matches(given: str, keys: tuple[str, ...]) -> bool:
    given_b = given.encode("utf-8", "replace")
    ok = False
    for key in keys:  # no early exit: the time taken does not depend on which key matched
        ok |= hmac.compare_digest(given_b, key.encode("utf-8"))
    return ok


class ApiKeyAuth:
    """ASGI middleware; a no-op when no key is configured."""

    def __init__(self, app: ASGIApp, keys: tuple[str, ...]) -> None:
        self.app, self.keys = app, tuple(keys)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        if scope["type"] != "http" or not self.keys or path in PUBLIC_PATHS or scope["method"] == "OPTIONS" \
                or path == PUBLIC_WEBUI[0] or path.startswith(PUBLIC_WEBUI[1]):
            await self.app(scope, receive, send)
            return
        given = presented_keys(Headers(scope=scope))
        if not any([key_matches(key, self.keys) for key in given]):   # a list: every key is compared
            err = ApiError(401, "Invalid API Key", "authentication_error")
            answer = error_response(err) if is_anthropic_path(scope["path"]) else err.response()
            await answer(scope, receive, send)
            return
        await self.app(scope, receive, send)
