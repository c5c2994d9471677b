"""GET and POST /lora-adapters (llama-server's LoRA endpoints; engine/lora_scales.py has the semantics).

GET lists the adapters loaded with `--lora` / `--lora-scaled` and their scales:
`[{"id", "path", "scale", "task_name", "prompt_prefix"}]` (`[]` without adapters).
POST takes `[{"id": 0, "scale": 0.5}, ...]` and sets the server's scales: listed adapters take
theirs, every other one 0, as llama-server; the answer is `{"success": true}`. New requests without
their own `lora` run with those scales; requests already running keep theirs. An id that names no
adapter, a scale that is no finite number, or a body that is no array is a 400 and changes nothing.
POST takes only `Content-Type: application/json` (415 otherwise), as the slot actions: it changes
what every later request computes, so no web page may send it without a preflight.
"""

from __future__ import annotations

import json

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from slotserver.engine.lora_scales import parse_entries
from slotserver.engine.request import RequestError
from slotserver.server.body import read_body, require_json_content_type
from slotserver.server.errors import bad_request
from slotserver.server.jsonio import JSONResp
from slotserver.server.state import ServerState


async def get_adapters(request: Request) -> Response:
    state: ServerState = request.app.state.server
    _, engine = state.require()
    return JSONResp(engine.lora.describe())


async def set_adapters(request: Request) -> Response:
    state: ServerState = request.app.state.server
    require_json_content_type(request)
    raw = await read_body(request, state.config.body_limit, state.config.timeout)
    _, engine = state.require()
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as e:
        raise bad_request(f"the body is not valid JSON ({e})") from None
    if not isinstance(body, list):
        raise bad_request("Request body must be an array")
    try:
        engine.lora.set(parse_entries(body, "body"))
    except RequestError as e:
        raise bad_request(str(e)) from None
    return JSONResp({"success": True})


ROUTES = [
    Route("/lora-adapters", get_adapters, methods=["GET"]),
    Route("/lora-adapters", set_adapters, methods=["POST"]),
]
