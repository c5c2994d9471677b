"""The router's HTTP app: llama-server's router routes over `ModelRouter`.

  GET  /health /v1/health          ok (the router itself; each model has its own)
  GET  /models /v1/models          every model with its status (?reload=1 reads the sources again)
  POST /models/load /models/unload {"model": NAME} -> {"success": true}
  POST /models {"model": "USER/REPO[:QUANT]"}, DELETE /models?model=NAME   downloads (downloads.py)
  GET  /models/sse                 state changes as server-sent events
  GET  /props                      the router's own (role "router"); ?model=NAME: that model's
  POST inference routes            to the model named by the body's `model` field
  GET  /metrics                    every loaded model's, labelled model="NAME" (?model=NAME: that one's)
  GET  /slots /lab ...             to the model named by `?model=` (so are POST /lab/layout, /lab/reload)
  ?autoload=true|false             per request, over --models-autoload

Errors are llama-server's JSON; the API key (auth.py) guards all but /health and the model lists.
CORS (--cors-origins) is the router's own, with the serving server's rules (access/cors.py); children
never get the flags, so a proxied answer does not carry the headers twice.
"""

from __future__ import annotations

import json
import logging
import time

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from slotserver import __version__
from slotserver.errors import ConfigError
from slotserver.router.auth import RouterAuth
from slotserver.access.api_prefix import ApiPrefix
from slotserver.access.cors import InferenceCors
from slotserver.router.errors import RouterError
from slotserver.router.listing import model_json, models_json
from slotserver.router.metrics import scrape
from slotserver.router.models import ModelRouter
from slotserver.router.proxy import forward

log = logging.getLogger("slotserver.router")
POST_ROUTES = ("/completion", "/completions", "/v1/completions", "/chat/completions", "/v1/chat/completions",
               "/v1/responses", "/responses", "/v1/responses/input_tokens", "/responses/input_tokens",
               "/v1/messages", "/v1/messages/count_tokens", "/infill", "/embedding", "/embeddings",
               "/v1/embeddings", "/rerank", "/reranking", "/v1/rerank", "/v1/reranking", "/tokenize",
               "/detokenize", "/apply-template", "/chat/completions/input_tokens",
               "/v1/chat/completions/input_tokens", "/props", "/slots/{id_slot}", "/lora-adapters")
GET_ROUTES = ("/slots", "/lora-adapters", "/lab", "/lab/events")
LAB_POST_ROUTES = ("/lab/layout", "/lab/reload")   # the model in ?model= (their bodies are the lab's)
PROMETHEUS_TEXT = "text/plain; version=0.0.4; charset=utf-8"


def _router(request: Request) -> ModelRouter:
    return request.app.state.router


def _autoload(request: Request) -> bool:
    value = request.query_params.get("autoload")
    return _router(request).config.autoload if value is None else value in ("true", "1")


async def _json_body(request: Request) -> dict:
    try:
        body = json.loads(await request.body() or b"{}")
    except (ValueError, UnicodeDecodeError):
        raise RouterError(400, "the request body is not valid JSON") from None
    if not isinstance(body, dict):
        raise RouterError(400, "the request body must be a JSON object")
    return body


async def _proxy(request: Request, name: str) -> Response:
    router = _router(request)
    child = await router.acquire(name, _autoload(request), request.is_disconnected)
    return await forward(router.client, request, child.url, child.auth, await request.body(),
                         lambda: router.release(name))


async def proxy_post(request: Request) -> Response:
    name = (await _json_body(request)).get("model")
    return await _proxy(request, name if isinstance(name, str) else "")


async def proxy_by_query(request: Request) -> Response:
    return await _proxy(request, request.query_params.get("model", ""))


async def props(request: Request) -> Response:
    if request.query_params.get("model"):
        return await proxy_by_query(request)
    config = _router(request).config
    return JSONResponse({"role": "router", "max_instances": config.models_max, "models_autoload": config.autoload,
                         "model_alias": "slotserver", "model_path": "none",
                         "default_generation_settings": {"params": {}, "n_ctx": 0},
                         "build_info": f"b{__version__}-slotserver"})


async def metrics(request: Request) -> Response:
    """?model=NAME: that model's own; else every loaded model's, labelled by model (metrics.py)."""
    if request.query_params.get("model"):
        return await proxy_by_query(request)
    router = _router(request)
    if not router.config.metrics:
        raise RouterError(501, "This server does not support metrics endpoint. Start it with `--metrics`")
    return Response(await scrape(router.client, router.instances), media_type=PROMETHEUS_TEXT)


async def models(request: Request) -> Response:
    router = _router(request)
    if request.query_params.get("reload"):
        try:
            await router.reload()
        except ConfigError as e:   # an edited preset file with a bad key: the old list stays
            raise RouterError(500, str(e)) from None
    listing = models_json(router.catalog, router.instances)
    listing["data"] += router.downloads.listing()
    return JSONResponse(listing)


async def model(request: Request) -> Response:
    """GET /v1/models/{id} (the OpenAI SDK's `models.retrieve`): one entry of the list, or OpenAI's 404."""
    router, name = _router(request), request.path_params["model_id"]
    if name not in router.catalog or name not in router.instances:
        raise RouterError(404, f"The model `{name}` does not exist.", "invalid_request_error",
                          extra={"code": "model_not_found", "param": None})
    return JSONResponse(model_json(router.catalog[name], router.instances[name], int(time.time())))


async def load(request: Request) -> Response:
    router, name = _router(request), (await _json_body(request)).get("model") or ""
    if name not in router.catalog:
        raise RouterError(404, "model is not found", "not_found_error")
    if router.instances[name].running:
        raise RouterError(400, "model is already running")
    await router.load(name)
    return JSONResponse({"success": True})


async def unload(request: Request) -> Response:
    router, name = _router(request), (await _json_body(request)).get("model") or ""
    if name in router.downloads.active and name not in router.catalog:   # a download in flight: stopped
        router.downloads.cancel(name)
        return JSONResponse({"success": True})
    if name not in router.catalog:
        raise RouterError(400, "model is not found")
    if not router.instances[name].running:
        raise RouterError(400, "model is not running")
    router.request_stop(name)
    return JSONResponse({"success": True})


async def sse(request: Request) -> Response:
    return StreamingResponse(_router(request).events.stream(), media_type="text/event-stream")


async def download(request: Request) -> Response:
    """POST /models {"model": "USER/REPO[:QUANT]"}: llama-server's download into the cache (downloads.py)."""
    name = (await _json_body(request)).get("model")
    if not isinstance(name, str) or not name:
        raise RouterError(400, "model must be a non-empty string")
    await _router(request).downloads.start(name)
    return JSONResponse({"success": True})


async def remove(request: Request) -> Response:
    """DELETE /models?model=NAME: a cache model's files removed (it is stopped first)."""
    name = request.query_params.get("model", "")
    if not name:
        raise RouterError(400, "model must be a non-empty string")
    await _router(request).downloads.remove(name)
    return JSONResponse({"success": True})


async def health(request: Request) -> Response:
    return JSONResponse({"status": "ok"})


async def _router_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, RouterError)
    return exc.response()


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    return RouterError(exc.status_code, str(exc.detail)).response()


async def _internal_error(request: Request, exc: Exception) -> Response:
    log.exception("router: %s %s failed", request.method, request.url.path, exc_info=exc)
    return RouterError(500, f"internal error: {type(exc).__name__}: {exc}").response()


def create_router_app(router: ModelRouter) -> Starlette:
    routes = [Route("/health", health), Route("/v1/health", health), Route("/models", models),
              Route("/v1/models", models), Route("/v1/models/{model_id:path}", model),
              Route("/models", download, methods=["POST"]), Route("/models", remove, methods=["DELETE"]),
              Route("/models/load", load, methods=["POST"]), Route("/models/unload", unload, methods=["POST"]),
              Route("/models/sse", sse), Route("/props", props), Route("/metrics", metrics)]
    routes += [Route(path, proxy_post, methods=["POST"]) for path in POST_ROUTES]
    routes += [Route(path, proxy_by_query) for path in GET_ROUTES]
    routes += [Route(path, proxy_by_query, methods=["POST"]) for path in LAB_POST_ROUTES]
    prefix = router.config.api_prefix
    stack = [Middleware(ApiPrefix, prefix=prefix)] if prefix else []
    stack += [Middleware(InferenceCors, policy=router.config.cors)] if router.config.cors.origins else []
    app = Starlette(routes=routes, middleware=[*stack, Middleware(RouterAuth, keys=router.config.api_keys)],
                    exception_handlers={RouterError: _router_error, HTTPException: _http_error,
                                        Exception: _internal_error})
    app.state.router = router
    return app
