"""The router's API keys: the serving server's rules (server/auth.py), restated without its imports.

`Authorization: Bearer KEY` or `X-Api-Key: KEY`; /health, /v1/health, /models and /v1/models stay
public, as in llama-server. The key is checked here and not passed on: children listen on loopback
without one. (server/auth.py cannot be imported: slotserver.server loads torch on import.)
"""

from __future__ import annotations

import hmac
from pathlib import Path

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from slotserver.errors import ConfigError
from slotserver.router.errors import RouterError

PUBLIC_PATHS = frozenset({"/health", "/v1/health", "/models", "/v1/models"})


def read_key_file(path: Path) -> list[str]:
    """--api-key-file: one key per line, blank lines ignored (as the serving server reads it)."""
    try:
        keys = [line.strip() for line in Path(path).read_text(encoding="utf-8").splitlines() if line.strip()]
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"--api-key-file {path}: {e}") from None
    if not keys:
        raise ConfigError(f"--api-key-file {path} holds no key")
    return keys


def _presented(headers: Headers) -> list[str]:
    keys = []
    auth = headers.get("authorization", "")
    if auth[:7].lower() == "bearer ":
        keys.append(auth[7:].strip())
    if headers.get("x-api-key") is not None:
        keys.append(headers["x-api-key"])
    return keys


def _matches(given: str, keys: tuple[str, ...]) -> bool:
    ok = False
    for key in keys:   # every key compared: the time taken does not say which matched
        ok |= hmac.compare_digest(given.encode("utf-8", "replace"), key.encode("utf-8"))
    return ok


class RouterAuth:
    def __init__(self, app: ASGIApp, keys: tuple[str, ...]) -> None:
        self.app, self.keys = app, tuple(keys)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and self.keys and scope["path"] not in PUBLIC_PATHS \
                and scope["method"] != "OPTIONS" \
                and not any([_matches(k, self.keys) for k in _presented(Headers(scope=scope))]):
            await RouterError(401, "Invalid API Key", "authentication_error").response()(scope, receive, send)
            return
        await self.app(scope, receive, send)
