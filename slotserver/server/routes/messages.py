"""POST /v1/messages and /v1/messages/count_tokens: Anthropic's Messages API, streaming or not.

The request is translated into a chat request (anthropic/params.py) and served by the same
machinery as /v1/chat/completions: one job, submitted to the engine, its answer shaped by
formats/anthropic.py. As on every route, all refusals happen before a stream starts, and a client
that leaves cancels its request. Errors, refusals included, are in Anthropic's shape
(anthropic/errors.py); one during a stream is an `error` event that ends it.
"""

from __future__ import annotations

import functools
from typing import AsyncIterator, Awaitable, Callable

import anyio
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from slotserver.engine.request import ErrorEvent, FinalEvent, TokenEvent
from slotserver.server.anthropic.errors import error_response
from slotserver.server.anthropic.params import MessagesJob, count_tokens, parse_messages_request
from slotserver.server.body import read_json
from slotserver.server.choices import submit_all, streamed
from slotserver.server.errors import ApiError
from slotserver.server.formats.anthropic import AnthropicFormatter, error_event
from slotserver.server.generation import Run
from slotserver.server.jsonio import JSONResp
from slotserver.server.routes.completion import log_state, respond
from slotserver.server.state import ServerState

Handler = Callable[[Request], Awaitable[Response]]


def anthropic_errors(handler: Handler) -> Handler:
    """Answers the ApiErrors the shared code raises (body, fields, submit) in Anthropic's shape."""
    @functools.wraps(handler)
    async def wrapped(request: Request) -> Response:
        try:
            return await handler(request)
        except ApiError as e:
            return error_response(e)
    return wrapped


@anthropic_errors
async def messages(request: Request) -> Response:
    state: ServerState = request.app.state.server
    bundle, engine = state.require()
    cfg = state.config
    body = await read_json(request, cfg.body_limit, cfg.timeout)

    def prepare() -> MessagesJob:
        return parse_messages_request(body, bundle.tokenizer, state.template, cfg.defaults, cfg.model_name,
                                      getattr(engine, "grammars", None), cfg.chat)

    job = await anyio.to_thread.run_sync(prepare)
    fmt = AnthropicFormatter(job.chat, job.omit_thinking)
    runs = submit_all(state, job.chat.jobs, log_state(request), job.chat.prompts)
    if job.chat.job.stream:
        return streamed(anthropic_stream(runs[0], fmt), runs, cfg.timeout, job.chat.job.sse_ping)
    return await respond(runs, request, lambda outs: JSONResp(fmt.full(outs[0])))


async def anthropic_stream(run: Run, fmt: AnthropicFormatter) -> AsyncIterator[bytes]:
    """message_start at once, then the blocks as text arrives, then message_delta / message_stop."""
    yield fmt.stream_start()
    events = run.events()
    try:
        async for ev in events:
            if isinstance(ev, TokenEvent):
                for chunk in fmt.stream_text(ev.text) if ev.text else ():
                    yield chunk
            elif isinstance(ev, FinalEvent):
                for chunk in fmt.stream_end(ev):
                    yield chunk
            elif isinstance(ev, ErrorEvent):
                yield error_event(500, ev.message)
    finally:
        await events.aclose()


@anthropic_errors
async def messages_count_tokens(request: Request) -> Response:
    state: ServerState = request.app.state.server
    bundle, _ = state.require()
    cfg = state.config
    body = await read_json(request, cfg.body_limit, cfg.timeout)
    n = await anyio.to_thread.run_sync(lambda: count_tokens(body, bundle.tokenizer, state.template, cfg.chat))
    return JSONResp({"input_tokens": n})


ROUTES = [
    Route("/v1/messages", messages, methods=["POST"]),
    Route("/v1/messages/count_tokens", messages_count_tokens, methods=["POST"]),
]
