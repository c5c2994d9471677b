"""CORS: llama-server's flags (`--cors-origins`, `--cors-methods`, `--cors-headers`,
`--cors-credentials`), on the inference and server-information endpoints only.

Without `--cors-origins` (or its older spelling here, `--cors ORIGIN`) there are no CORS headers at
all, so a browser lets no other origin read an answer or send a request that needs a preflight.
That default is a deliberate difference from llama-server, which allows any origin (README,
"Security"): a page the user happens to visit should not read the server's answers. With the
flag, llama-server's values mean what they mean there:

  `*`            any origin; with credentials (the default) the request's Origin is echoed, as
                 llama-server does, since a browser refuses `*` on a credentialed request
  `localhost`    only an Origin whose host is localhost, 127.0.0.1 or [::1] (any scheme, any port)
  a list         comma-separated exact origins (`https://ui.example:3000`); a listed one is echoed

Methods and headers: llama-server's defaults (`GET, POST, DELETE, OPTIONS`, `*`). Starlette's
CORSMiddleware does the protocol; with headers `*` it echoes the headers a preflight asks for,
which a browser needs for `Authorization` (never covered by `*`).

The policy applies on an allowlist of paths (`CORS_PATHS`): the inference endpoints and what a web
UI reads to set itself up (health, props, models). Everything else skips it entirely: the slots
(`/slots`, `/slots/N?action=save|restore|erase`, which read or overwrite other clients' KV and
files), `/metrics`, the router's model loading, and the lab (`/lab/layout`, `/lab/reload`, which
change the code the engine runs). A preflight there gets no `Access-Control-Allow-Origin` (the
route answers 405 to OPTIONS), so the browser never sends the request. Together with those verbs
taking only `Content-Type: application/json` (which always needs a preflight), no page on any
origin can act on slots or the lab; only a non-browser client (curl, `slotserver top`) can.
An allowlist rather than a denylist, so that a route added later stays out of CORS until someone
decides a web page may call it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from starlette.middleware.cors import CORSMiddleware
from starlette.types import ASGIApp, Receive, Scope, Send

from slotserver.errors import ConfigError

CORS_PATHS = frozenset({
    "/completion", "/completions", "/v1/completions", "/v1/chat/completions", "/chat/completions",
    "/tokenize", "/detokenize", "/apply-template", "/infill",
    "/v1/responses", "/responses", "/v1/responses/input_tokens", "/responses/input_tokens",
    "/v1/chat/completions/input_tokens", "/chat/completions/input_tokens", "/v1/messages", "/v1/messages/count_tokens",
    "/embedding", "/embeddings", "/v1/embeddings", "/rerank", "/reranking", "/v1/rerank", "/v1/reranking",
    "/health", "/v1/health", "/props", "/models", "/v1/models",
})
MODEL_PREFIX = "/v1/models/"   # GET /v1/models/{id}: read-only, as /v1/models
LOCALHOST = r"[a-zA-Z][a-zA-Z0-9+.-]*://(localhost|127\.0\.0\.1|\[::1\])(:[0-9]+)?"
ORIGIN = re.compile(r"[a-zA-Z][a-zA-Z0-9+.-]*://[^/?#\s]+")   # scheme://host[:port], no path


def inside_cors(path: str) -> bool:
    """True for the paths an allowed origin may call (exact matches: `/slots/0` or `/lab` are not)."""
    return path in CORS_PATHS or (path.startswith(MODEL_PREFIX) and len(path) > len(MODEL_PREFIX))


def _csv(value: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in value.split(",") if part.strip())


@dataclass(frozen=True)
class CorsPolicy:
    """`origins` empty: no CORS at all. Values as llama-server's flags take them (see the module doc)."""

    origins: tuple[str, ...] = ()
    methods: str = "GET, POST, DELETE, OPTIONS"
    headers: str = "*"
    credentials: bool = True

    def __post_init__(self) -> None:
        special = [o for o in self.origins if o in ("*", "localhost")]
        if special and len(self.origins) > 1:
            raise ConfigError(f"--cors-origins: {special[0]!r} stands alone, not in a list ({', '.join(self.origins)})")
        for origin in self.origins:
            if not special and not ORIGIN.fullmatch(origin):
                raise ConfigError(f"--cors-origins: {origin!r} is not an origin: scheme://host[:port], "
                                  "no path or trailing slash (or * or localhost)")
        if self.origins and not _csv(self.methods):
            raise ConfigError("--cors-methods: no method given")

    @classmethod
    def from_args(cls, args) -> CorsPolicy:
        """The policy `slotserver serve`'s flags ask for (the server's and the router's); each
        --cors-origins value is comma-separated origins (repeatable)."""
        origins = tuple(o for value in args.cors for o in _csv(value))
        return cls(origins, args.cors_methods, args.cors_headers, args.cors_credentials)

    def middleware_options(self) -> dict:
        """Starlette CORSMiddleware's keyword arguments for this policy."""
        local = self.origins == ("localhost",)
        options = {"allow_origins": [] if local else list(self.origins),
                   "allow_methods": [m.upper() for m in _csv(self.methods)],
                   "allow_headers": list(_csv(self.headers)), "allow_credentials": self.credentials}
        return options | ({"allow_origin_regex": LOCALHOST} if local else {})


class InferenceCors:
    """ASGI middleware: `policy` on the `inside_cors` paths only (see the module doc)."""

    def __init__(self, app: ASGIApp, policy: CorsPolicy) -> None:
        self.app = app
        self.cors = CORSMiddleware(app, **policy.middleware_options())

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and not inside_cors(scope["path"]):
            await self.app(scope, receive, send)
            return
        await self.cors(scope, receive, send)
