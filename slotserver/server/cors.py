"""CORS (`--cors ORIGIN`) for the inference and server-information endpoints only.

Without --cors there are no CORS headers at all, so a browser lets no other origin read an answer
or send a request that needs a preflight. With --cors, starlette's CORSMiddleware answers
preflights and adds the headers on an allowlist of paths (`CORS_PATHS`): the inference
endpoints (completions, chat, responses, tokenize, detokenize, apply-template) and what a web UI reads to
set itself up (health, props, models). Everything else skips it entirely: the slots
(`/slots`, `/slots/N?action=save|restore|erase`, which read or overwrite other clients' KV and
files), `/metrics`, and the lab (`/lab/layout`, `/lab/reload`, which change the code the engine
runs). A preflight there gets no `Access-Control-Allow-Origin` (the route answers 405 to
OPTIONS), so the browser never sends the request. Together with those verbs taking only
`Content-Type: application/json` (which always needs a preflight), no page on any origin can
act on slots or the lab; only a non-browser client (curl, `slotserver top`) can.

An allowlist rather than a denylist, so that a route added later stays out of CORS until someone
decides a web page may call it.
"""

from __future__ import annotations

from starlette.middleware.cors import CORSMiddleware
from starlette.types import ASGIApp, Receive, Scope, Send

CORS_PATHS = frozenset({
    "/completion", "/completions", "/v1/completions", "/v1/chat/completions", "/chat/completions",
    "/tokenize", "/detokenize", "/apply-template", "/infill",
    "/v1/responses", "/responses", "/v1/responses/input_tokens", "/responses/input_tokens",
    "/v1/chat/completions/input_tokens", "/chat/completions/input_tokens", "/v1/messages", "/v1/messages/count_tokens",
    "/health", "/v1/health", "/props", "/models", "/v1/models",
})
MODEL_PREFIX = "/v1/models/"   # GET /v1/models/{id}: read-only, as /v1/models


def inside_cors(path: str) -> bool:
    """True for the paths a listed origin may call (exact matches: `/slots/0` or `/lab` are not)."""
    return path in CORS_PATHS or (path.startswith(MODEL_PREFIX) and len(path) > len(MODEL_PREFIX))


class InferenceCors:
    """ASGI middleware: CORS for `origins` on the `inside_cors` paths only (see the module doc)."""

    def __init__(self, app: ASGIApp, origins: tuple[str, ...]) -> None:
        self.app = app
        self.cors = CORSMiddleware(app, allow_origins=list(origins),
                                   allow_methods=["GET", "POST", "OPTIONS"], allow_headers=["*"])

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and not inside_cors(scope["path"]):
            await self.app(scope, receive, send)
            return
        await self.cors(scope, receive, send)
