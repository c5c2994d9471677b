"""`create_app(state)`: the starlette application of the HTTP server.

Middleware, outermost first:
  ApiPrefix    only with --api-prefix: the prefix comes off every path, anything outside it is a 404
  AccessLog    one line per request (method, path, status, tokens, ms)
  CatchAll     an unexpected exception -> logged 500 JSON error; the server keeps serving
  CORS         only with --cors-origins (no CORS headers at all otherwise), on inference and info paths only
               (access/cors.py)
  LoadingGate  503 "Loading model" for every route but /health and the web page until the model is loaded
  WakeGate     a sleeping engine (--sleep-idle-seconds) wakes for every route but the read-only ones
  ApiKeyAuth   401 without a valid key, when keys are configured (public: health, models, the web page)
Routes raise `ApiError`; routing errors (404, 405) get the same JSON error shape.
"""

from __future__ import annotations

from typing import Callable

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Receive, Scope, Send

from slotserver.server.access_log import AccessLog
from slotserver.server.auth import ApiKeyAuth
from slotserver.access.api_prefix import ApiPrefix
from slotserver.access.cors import InferenceCors
from slotserver.server.errors import (ApiError, CatchAll, api_error_handler, http_exception_handler,
                                      loading_error, not_supported)
from slotserver.server.routes import completion, lab, lora, messages, misc, openai, responses, slots
from slotserver.server.routes import embeddings, rerank
from slotserver.server.routes import infill
from slotserver.server.routes import webui
from slotserver.server.state import ServerState
from slotserver.server.wake_gate import WakeGate

PROMETHEUS_TEXT = "text/plain; version=0.0.4; charset=utf-8"


class LoadingGate:
    """503 "Loading model" for everything but /health while `is_ready()` is false (as llama-server)."""

    def __init__(self, app: ASGIApp, is_ready: Callable[[], bool]) -> None:
        self.app, self.is_ready = app, is_ready

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        # the web page loads while the model does (it shows the 503s of the API it polls)
        if scope["type"] == "http" and not self.is_ready() and scope["path"] not in ("/health", "/v1/health") \
                and not webui.is_webui_path(scope["path"]):
            await loading_error().response()(scope, receive, send)
            return
        await self.app(scope, receive, send)


async def metrics(request: Request) -> Response:
    state: ServerState = request.app.state.server
    if not state.config.metrics:
        raise not_supported("This server does not support metrics endpoint. Start it with `--metrics`")
    state.require()
    response = Response(state.metrics.render(), media_type=PROMETHEUS_TEXT)
    # llama-server's spelling: starlette lowercases the names it is given, and clients that read
    # headers into a plain dict look this one up with its capitals
    response.raw_headers.append((b"Process-Start-Time-Unix", str(state.created).encode()))
    return response


def _middleware(state: ServerState) -> list[Middleware]:
    stack = [Middleware(ApiPrefix, prefix=state.config.api_prefix)] if state.config.api_prefix else []
    stack += [Middleware(AccessLog), Middleware(CatchAll)]
    if state.config.cors.origins:
        stack.append(Middleware(InferenceCors, policy=state.config.cors))
    stack.append(Middleware(LoadingGate, is_ready=lambda: state.ready))
    stack.append(Middleware(WakeGate, engine=lambda: state.engine))   # --sleep-idle-seconds
    stack.append(Middleware(ApiKeyAuth, keys=state.config.api_keys))
    return stack


def create_app(state: ServerState) -> Starlette:
    """The ASGI app serving `state` (which may still be loading: see `ServerState.set_loaded`)."""
    routes = [*misc.ROUTES, *completion.ROUTES, *openai.ROUTES, *messages.ROUTES, *responses.ROUTES,
              *slots.ROUTES, *lab.ROUTES, *lora.ROUTES, Route("/metrics", metrics, methods=["GET"]),
              *embeddings.ROUTES, *rerank.ROUTES, *infill.ROUTES]
    if state.config.webui and state.config.static_path is not None:   # --path: its files at /, not the page
        routes.append(Mount("/", app=StaticFiles(directory=state.config.static_path, html=True)))
    elif state.config.webui:   # --no-webui: 404 at / (--path's files too), as llama-server
        routes += webui.routes()
    app = Starlette(routes=routes, middleware=_middleware(state),
                    exception_handlers={ApiError: api_error_handler, HTTPException: http_exception_handler})
    app.state.server = state
    return app
