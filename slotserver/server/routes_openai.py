"""POST /v1/completions and /v1/chat/completions (OpenAI-compatible), streaming or not.

Streams follow OpenAI: `data: {chunk}` events, then `data: [DONE]`. As on /completion, every
refusal happens before the stream starts, and a client that leaves cancels its request.
"""

from __future__ import annotations

from typing import AsyncIterator

import anyio
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from slotserver.engine.request import FinalEvent, TokenEvent
from slotserver.server import sse
from slotserver.server.body import read_json
from slotserver.server.errors import ApiError
from slotserver.server.format_openai import OpenAIFormatter
from slotserver.server.generation import Run, submit
from slotserver.server.jsonio import JSONResp
from slotserver.server.openai_params import OpenAIJob, parse_chat, parse_openai_completion
from slotserver.server.routes_completion import log_state, respond
from slotserver.server.state import ServerState


async def chat_completions(request: Request) -> Response:
    return await _serve(request, chat=True)


async def completions(request: Request) -> Response:
    return await _serve(request, chat=False)


async def _serve(request: Request, chat: bool) -> Response:
    state: ServerState = request.app.state.server
    bundle, engine = state.require()
    cfg = state.config
    body = await read_json(request, cfg.body_limit, cfg.timeout)

    def prepare() -> OpenAIJob:
        grammars = getattr(engine, "grammars", None)
        if chat:
            return parse_chat(body, bundle.tokenizer, state.template, cfg.defaults, cfg.model_name, grammars)
        return parse_openai_completion(body, bundle.tokenizer, cfg.defaults, cfg.model_name, grammars)

    oa = await anyio.to_thread.run_sync(prepare)
    fmt = OpenAIFormatter(oa.job, oa.model, bundle.tokenizer, chat, oa.tools)
    run = submit(state, oa.job, log_state(request), oa.prompt)
    if oa.job.stream:
        return sse.EventStreamResponse(openai_stream(run, fmt), on_close=run.close, write_timeout=cfg.timeout)
    return await respond(run, request, lambda out: JSONResp(fmt.full(out)))


async def openai_stream(run: Run, fmt: OpenAIFormatter) -> AsyncIterator[bytes]:
    """Role chunk (chat), one chunk per token that completes text, the finish chunk, [DONE]."""
    if fmt.chat:
        yield sse.event(fmt.role_chunk())
    pending: list[TokenEvent] = []
    async for ev in run.events():
        if isinstance(ev, TokenEvent):
            pending.append(ev)
            if ev.text:
                for chunk in fmt.stream_pieces(ev.text, pending):
                    yield sse.event(chunk)
                pending = []
        elif isinstance(ev, FinalEvent):
            for chunk in fmt.stream_pieces(ev.text, pending, final=True):
                yield sse.event(chunk)
            yield sse.event(fmt.last_chunk(ev))
            if fmt.job.include_usage:
                yield sse.event(fmt.usage_chunk(ev))
        else:
            yield sse.event(ApiError(500, ev.message, "server_error").body())
    yield sse.DONE


ROUTES = [
    Route("/v1/completions", completions, methods=["POST"]),
    Route("/v1/chat/completions", chat_completions, methods=["POST"]),
    Route("/chat/completions", chat_completions, methods=["POST"]),
]
