"""The lab over HTTP: live KV layouts and kernels (`engine.lab`).

GET /lab            the lab's snapshot: layouts, kernels, versions, stats, recent events
POST /lab/layout    {"layout": name}: switch the KV layout between steps (in-flight requests migrate)
POST /lab/reload    {"path": optional}: reload kernels/layouts from disk now
GET /lab/events     server-sent events, one per lab event with `seq` > ?since=N, then new ones live

The lab's verbs return futures completed on the engine thread; a refused switch or reload (bad
name, a module that fails validation) is a 400 with the lab's reason. Without a lab (an engine
that predates it) every route answers 501.

Who may call what. The two POST verbs change which code the engine runs, so they are guarded
beyond the inference routes:
  - they take only `Content-Type: application/json` (415 otherwise), and no /lab route ever gets
    CORS headers, even with --cors (cors.py): a web page cannot reach them from a browser;
  - with --api-key, every /lab route needs the key (auth.py);
  - `--no-lab-api` turns them off: 403 saying so, checked before the body is read.
GET /lab and /lab/events stay readable with --no-lab-api: they only report (names, versions,
stats, events), change nothing, and `slotserver top` polls them to show the server. The file
watcher (a save in kernels/ or layouts/) is a separate path, governed by --no-watch.
"""

from __future__ import annotations

import re

import asyncio
from typing import AsyncIterator

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from slotserver.server import sse
from slotserver.server.body import read_json
from slotserver.server.errors import ApiError, bad_request, not_supported
from slotserver.server.fields import Fields
from slotserver.server.jsonio import JSONResp
from slotserver.server.state import ServerState

POLL_S = 0.2
KEEPALIVE_S = 15.0


def _lab(request: Request):
    state: ServerState = request.app.state.server
    state.require()
    lab = state.lab()
    if lab is None:
        raise not_supported("the lab is not available in this engine yet")
    return state, lab


async def _await(future) -> dict:
    """The lab's answer; a refusal (its event says result "refused") is a 400 with the reason."""
    try:
        result = await asyncio.wrap_future(future)
    except (ValueError, LookupError) as e:   # RequestError, ModuleLoadError, unknown names
        raise ApiError(400, str(e)) from None
    except FileNotFoundError as e:
        raise ApiError(404, str(e), "not_found_error") from None
    if isinstance(result, dict) and result.get("result") == "refused":
        where = f" (line {result['line']})" if result.get("line") not in (None, "?") else ""
        raise ApiError(400, f"{result.get('kind', 'change')} '{result.get('name', '')}' refused: "
                            f"{result.get('reason', 'no reason given')}{where}")
    return result


async def lab_snapshot(request: Request) -> Response:
    _, lab = _lab(request)
    return JSONResp(lab.snapshot())


def _verbs_enabled(request: Request) -> None:
    """403 with --no-lab-api (before anything else: a disabled verb reads no body)."""
    state: ServerState = request.app.state.server
    if not state.config.lab_api:
        raise ApiError(403, "the lab API is disabled: this server was started with --no-lab-api "
                            "(POST /lab/layout and /lab/reload are off; GET /lab still reports)")


async def _read_verb_body(request: Request, state: ServerState, allow_empty: bool) -> dict:
    return await read_json(request, state.config.body_limit, state.config.timeout,
                           allow_empty=allow_empty, require_json_type=True)


async def lab_layout(request: Request) -> Response:
    _verbs_enabled(request)
    state, lab = _lab(request)
    f = Fields(await _read_verb_body(request, state, allow_empty=False))
    name = f.str("layout")
    if not name:
        raise bad_request("'layout' (a layout name) is required")
    return JSONResp(await _await(lab.switch_layout(name)))


async def lab_reload(request: Request) -> Response:
    _verbs_enabled(request)
    state, lab = _lab(request)
    body = await _read_verb_body(request, state, allow_empty=True)
    return JSONResp(await _await(lab.reload(Fields(body).str("path"))))


async def lab_events(request: Request) -> Response:
    state, lab = _lab(request)
    raw = request.query_params.get("since", "0")
    if not re.fullmatch(r"-?[0-9]+", raw):   # str.isdigit() accepts "²"; lstrip("-") accepted "--1"
        raise bad_request(f"'since' must be an integer, got {raw!r}")
    return sse.EventStreamResponse(follow_events(lab, int(raw)), write_timeout=state.config.timeout)


async def follow_events(lab, since: int) -> AsyncIterator[bytes]:
    """Every event with seq > since, then new ones as they come (polled), with keep-alives."""
    idle = 0.0
    while True:
        events = lab.events_since(since)
        for ev in events:
            since = max(since, int(ev.get("seq", since)))
            yield sse.event(ev)
        idle = 0.0 if events else idle + POLL_S
        if idle >= KEEPALIVE_S:
            idle = 0.0
            yield sse.comment("keep-alive")
        await asyncio.sleep(POLL_S)


ROUTES = [
    Route("/lab", lab_snapshot, methods=["GET"]),
    Route("/lab/layout", lab_layout, methods=["POST"]),
    Route("/lab/reload", lab_reload, methods=["POST"]),
    Route("/lab/events", lab_events, methods=["GET"]),
]
