"""POST /v1/responses (and /responses, as llama-server): OpenAI's Responses API, streaming or not;
POST /v1/responses/input_tokens: the prompt's token count; GET/DELETE /v1/responses/{id}: 404.

A Responses body is converted into a chat-completions body (responses/params.py) and parsed,
validated and run by the chat machinery, then answered in the Responses shapes
(formats/responses.py, formats/responses_stream.py). As on every route, all refusals happen
before a stream starts, and a client that leaves cancels its request. Nothing is stored: the
retrieve and delete routes say so with a 404 (OpenAI's answer to an id it does not know).
"""

from __future__ import annotations

from typing import AsyncIterator

import anyio
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from slotserver.engine.request import FinalEvent, ProgressEvent, TokenEvent
from slotserver.server.body import read_json
from slotserver.server.choices import merged, streamed, submit_all
from slotserver.server.errors import ApiError
from slotserver.server.formats.openai import OpenAIFormatter
from slotserver.server.formats.responses import ResponsesFormatter
from slotserver.server.formats.responses_stream import ResponseStream, frame
from slotserver.server.generation import Run
from slotserver.server.jsonio import JSONResp
from slotserver.server.openai_params import OpenAIJob, parse_chat
from slotserver.server.responses.params import ResponsesRequest, parse_responses
from slotserver.server.routes.completion import log_state, respond
from slotserver.server.state import ServerState


def _prepare(state: ServerState, body: dict) -> tuple[ResponsesRequest, OpenAIJob]:
    """The body -> (the converted request, the chat job); tokenizes and compiles: off the loop."""
    bundle, engine = state.require()
    cfg, grammars = state.config, getattr(engine, "grammars", None)
    req = parse_responses(body, grammars)
    oa = parse_chat(req.chat, bundle.tokenizer, state.template, cfg.defaults, cfg.model_name, grammars,
                    engine.config.n_parallel, cfg.chat)
    return req, oa


async def create_response(request: Request) -> Response:
    state: ServerState = request.app.state.server
    bundle, _ = state.require()
    cfg = state.config
    body = await read_json(request, cfg.body_limit, cfg.timeout)
    req, oa = await anyio.to_thread.run_sync(lambda: _prepare(state, body))
    chat = OpenAIFormatter(oa.job, oa.model, bundle.tokenizer, True, oa.tools, oa.reasoning)
    fmt = ResponsesFormatter(chat, req.echo, bundle.tokenizer)
    runs = submit_all(state, oa.jobs, log_state(request), oa.prompts)
    if oa.job.stream:
        events = response_events(runs[0], ResponseStream(fmt, req.obfuscate))
        return streamed(events, runs, cfg.timeout, oa.job.sse_ping)
    return await respond(runs, request, lambda outs: JSONResp(fmt.full(outs[0])))


async def response_events(run: Run, stream: ResponseStream) -> AsyncIterator[bytes]:
    """The whole event stream of one answer (formats/responses_stream.py has the order)."""
    for event in stream.start():
        yield frame(event)
    pending: list[TokenEvent] = []
    async for _, ev in merged([run]):
        if isinstance(ev, TokenEvent):
            pending.append(ev)
            if not ev.text:
                continue
            events, pending = stream.tokens(ev.text, pending), []
        elif isinstance(ev, ProgressEvent):
            events = stream.progress(ev)
        elif isinstance(ev, FinalEvent):
            events = stream.tokens(ev.text, pending, final=True) + stream.finish(ev)
        else:
            events = stream.error(ev.message)
        for event in events:
            yield frame(event)


async def count_input_tokens(request: Request) -> Response:
    """llama-server's /v1/responses/input_tokens: the prompt the body would run, counted."""
    state: ServerState = request.app.state.server
    state.require()
    body = await read_json(request, state.config.body_limit, state.config.timeout)
    _, oa = await anyio.to_thread.run_sync(lambda: _prepare(state, {**body, "stream": False}))
    return JSONResp({"object": "response.input_tokens", "input_tokens": len(oa.job.request.prompt_ids)})


async def stored_response(request: Request) -> Response:
    """Retrieve, delete or cancel a stored response: none are stored."""
    rid = request.path_params["response_id"]
    raise ApiError(404, f"No response found with id '{rid[:80]}': this server stores no responses "
                        "(it is stateless; 'store: true' is refused)", "not_found_error")


ROUTES = [
    Route("/v1/responses", create_response, methods=["POST"]),
    Route("/responses", create_response, methods=["POST"]),
    Route("/v1/responses/input_tokens", count_input_tokens, methods=["POST"]),
    Route("/responses/input_tokens", count_input_tokens, methods=["POST"]),
    Route("/v1/responses/{response_id}", stored_response, methods=["GET", "DELETE"]),
    Route("/v1/responses/{response_id}/cancel", stored_response, methods=["POST"]),
]
