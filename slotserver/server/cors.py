"""CORS (`--cors ORIGIN`) for every route except the lab's, which no web page may reach.

Without --cors there are no CORS headers at all, so a browser lets no other origin read an answer
or send a request that needs a preflight. With --cors, starlette's CORSMiddleware answers
preflights and adds the headers, except under `/lab`: those requests skip it entirely, so a
preflight to /lab/layout or /lab/reload gets no `Access-Control-Allow-Origin` (the route answers
405 to OPTIONS) and the browser never sends the request. Together with the lab's verbs taking only
`Content-Type: application/json` (which always needs a preflight), no page on any origin can
switch layouts or reload kernels; only a non-browser client (curl, `slotserver top`) can.
"""

from __future__ import annotations

from starlette.middleware.cors import CORSMiddleware
from starlette.types import ASGIApp, Receive, Scope, Send

NO_CORS_PREFIX = "/lab"


def outside_cors(path: str) -> bool:
    """True for `/lab` and everything under `/lab/` (not for, say, `/labels`)."""
    return path == NO_CORS_PREFIX or path.startswith(NO_CORS_PREFIX + "/")


class CorsExceptLab:
    """ASGI middleware: CORS for `origins` on every path but the lab's (see the module doc)."""

    def __init__(self, app: ASGIApp, origins: tuple[str, ...]) -> None:
        self.app = app
        self.cors = CORSMiddleware(app, allow_origins=list(origins),
                                   allow_methods=["GET", "POST", "OPTIONS"], allow_headers=["*"])

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and outside_cors(scope["path"]):
            await self.app(scope, receive, send)
            return
        await self.cors(scope, receive, send)
