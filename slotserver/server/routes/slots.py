"""GET /slots and POST /slots/{id}?action=save|restore|erase (llama-server's slot endpoints).

GET /slots reads the engine's stats snapshot; it never shows prompt text unless the server was
started with --slots-debug (prompts are other users' data). `?fail_on_no_slot=1` answers 503
when every slot is busy, which is what load balancers poll. Disabled with --no-slots (501).

Slot actions need --slot-save-path (501 otherwise, as in llama-server). Save and restore take
only `Content-Type: application/json` (415 otherwise): they write files and replace state, so no
web page may trigger them with a cross-origin request that needs no preflight. File names are checked
here with the engine's own rule (`slot_files.check_name`) as well as in the engine, so a name
such as `../evil` or `x.bin\n` is refused before anything runs.
"""

from __future__ import annotations

import asyncio

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from slotserver.engine.request import RequestError
from slotserver.server.body import read_json
from slotserver.server.errors import ApiError, bad_request, not_supported
from slotserver.server.fields import Fields
from slotserver.server.jsonio import JSONResp
from slotserver.server.state import ServerState
from slotserver.engine.slot_files import check_name
from slotserver.engine.stats import SlotStats

ACTIONS = ("save", "restore", "erase")


def slot_json(s: SlotStats, prompt: str | None) -> dict:
    busy = s.state == "processing"
    out = {
        "id": s.id, "id_task": s.id_task, "n_ctx": s.n_ctx, "speculative": s.speculative, "is_processing": busy,
        "state": s.state, "stream": s.stream, "cells_used": s.cells_used, "n_prompt": s.n_prompt,
        "n_cached": s.n_cached, "tokens_per_second": s.tokens_per_second, "elapsed_s": s.elapsed_s,
        # this slot's requests so far: prompt tokens reused from a cache (its KV or --cache-ram) and computed
        "prompt_cache": {"n_cached": s.prompt_cached, "n_computed": s.prompt_computed,
                         "hit_rate": round(s.prompt_cached / max(1, s.prompt_cached + s.prompt_computed), 4)},
        # llama-server's list; an idle slot keeps nothing of its last task (n_remain -1, n_decoded 0);
        # a busy one's remaining budget is not in the stats snapshot: -1 (unknown), as with no n_predict
        "next_token": [{"has_next_token": busy, "has_new_line": False, "n_remain": -1,
                        "n_decoded": s.n_generated if busy else 0, "stopping_word": ""}],
    }
    if prompt is not None:
        out["prompt"] = prompt
    return out


async def slots(request: Request) -> Response:
    state: ServerState = request.app.state.server
    if not state.config.slots_endpoint:
        raise not_supported("This server does not support slots endpoint. Start it with `--slots`")
    _, engine = state.require()
    stats = engine.stats()
    if request.query_params.get("fail_on_no_slot") not in (None, "", "0", "false"):
        if all(s.state != "idle" for s in stats.slots):
            raise ApiError(503, "no slot available")
    debug = state.config.slots_debug
    return JSONResp([slot_json(s, state.prompts.get(s.id_task, "") if debug else None) for s in stats.slots])


def _slot_id(raw: str) -> int:
    if not raw.isdigit():
        raise bad_request(f"Invalid slot ID {raw!r}")
    return int(raw)


def _filename(body: dict, action: str) -> str | None:
    if action == "erase":
        return None
    name = Fields(body).str("filename")
    try:
        return check_name(name)  # the engine's own rule (slot_files), so the two cannot drift
    except RequestError:
        raise bad_request(f"Invalid filename {name!r}: use letters, digits, '.', '_' and '-' only") from None


def _status_of(e: BaseException) -> ApiError | None:
    """Engine exceptions -> HTTP: bad input 400, missing file 404, busy slot 409."""
    if isinstance(e, (RequestError, ValueError)):
        return ApiError(400, str(e))
    if isinstance(e, FileNotFoundError):
        return ApiError(404, str(e), "not_found_error")
    if type(e).__name__ == "SlotBusy":
        return ApiError(409, str(e), "unavailable_error")
    return None


async def slot_action(request: Request) -> Response:
    state: ServerState = request.app.state.server
    if state.config.slot_save_path is None:
        raise not_supported("This server does not support slots action. Start it with `--slot-save-path`")
    _, engine = state.require()
    action = request.query_params.get("action", "")
    # save writes a file and restore replaces a slot's state: like the lab, they take only JSON, so
    # a web page cannot send them a cross-origin "simple" request (erase only drops a cache)
    body = await read_json(request, state.config.body_limit, state.config.timeout, allow_empty=True,
                           require_json_type=action in ("save", "restore"))
    slot_id = _slot_id(request.path_params["id_slot"])
    if action not in ACTIONS:
        raise bad_request(f"Invalid action {action!r}: use one of {', '.join(ACTIONS)}")
    filename = _filename(body, action)
    if not hasattr(engine, "slot_action"):
        raise not_supported("slot save/restore is not available in this engine yet")
    try:
        result = await asyncio.wrap_future(engine.slot_action(slot_id, action, filename))
    except Exception as e:  # noqa: BLE001 - mapped below; anything else is a real server error
        mapped = _status_of(e)
        if mapped is None:
            raise
        raise mapped from None
    return JSONResp(result)


ROUTES = [
    Route("/slots", slots, methods=["GET"]),
    Route("/slots/{id_slot}", slot_action, methods=["POST"]),
]
