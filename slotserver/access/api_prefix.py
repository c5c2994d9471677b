"""`--api-prefix /PREFIX` (llama-server's): every route is served under PREFIX, for a reverse proxy that
forwards `https://host/llm/v1/chat/completions` as `/llm/v1/chat/completions`.

The prefix comes off the path before anything else sees it (API keys, CORS and the routes all work
on the unprefixed path); a path outside it is llama-server's 404. `GET /PREFIX` is redirected to
`/PREFIX/`, so that the web page's relative links (its files, its API calls) resolve under the prefix.
"""

from __future__ import annotations

import re

from starlette.responses import JSONResponse, RedirectResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from slotserver.errors import ConfigError

PREFIX = re.compile(r"(/[A-Za-z0-9._~!$&'()*+,;=:@%-]+)+")   # path segments, no trailing slash


def check_prefix(prefix: str) -> str:
    """'' (none) or `/a[/b...]`; anything else is a ConfigError naming the flag."""
    if prefix and not PREFIX.fullmatch(prefix):
        raise ConfigError(f"--api-prefix {prefix!r}: expected a path such as /llm (a leading slash, "
                          "no trailing slash, no query)")
    return prefix


class ApiPrefix:
    """ASGI middleware: strips `prefix` from every path (see the module doc); outermost."""

    def __init__(self, app: ASGIApp, prefix: str) -> None:
        self.app, self.prefix = app, check_prefix(prefix)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope["path"]
        if path.startswith(self.prefix + "/"):
            raw = scope.get("raw_path") or b""
            head = self.prefix.encode()
            scope = {**scope, "path": path[len(self.prefix):],
                     "raw_path": raw[len(head):] if raw.startswith(head) else raw}
            await self.app(scope, receive, send)
        elif path == self.prefix and scope["method"] in ("GET", "HEAD"):
            query = scope.get("query_string", b"").decode("latin-1")
            await RedirectResponse(self.prefix + "/" + (f"?{query}" if query else ""), 308)(scope, receive, send)
        else:
            error = {"code": 404, "message": "File Not Found", "type": "not_found_error"}
            await JSONResponse({"error": error}, status_code=404)(scope, receive, send)
