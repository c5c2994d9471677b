"""POST /v1/completions and /v1/chat/completions (OpenAI-compatible), streaming or not.

Streams follow OpenAI: `data: {chunk}` events, then `data: [DONE]`. As on /completion, every
refusal happens before the stream starts, and a client that leaves cancels its request.
"""

from __future__ import annotations

import dataclasses
from typing import AsyncIterator

import anyio
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from slotserver.engine.request import FinalEvent, ProgressEvent, TokenEvent
from slotserver.server import sse
from slotserver.server.body import read_json
from slotserver.server.errors import ApiError
from slotserver.server.formats.openai import OpenAIFormatter
from slotserver.server.choices import submit_all, streamed
from slotserver.server.choices import merged
from slotserver.server.generation import Run
from slotserver.server.jsonio import JSONResp
from slotserver.server.openai_params import OpenAIJob, parse_chat, parse_openai_completion
from slotserver.server.routes.completion import log_state, respond
from slotserver.server.state import ServerState


async def chat_completions(request: Request) -> Response:
    return await _serve(request, chat=True)


async def completions(request: Request) -> Response:
    return await _serve(request, chat=False)


def _prepare(state: ServerState, body: dict, chat: bool) -> OpenAIJob:
    """A chat or completion body parsed into jobs, with the server's defaults and grammars."""
    bundle, engine = state.require()
    cfg = state.config
    grammars, n_parallel = getattr(engine, "grammars", None), engine.config.n_parallel
    if chat:
        return parse_chat(body, bundle.tokenizer, state.template, cfg.defaults, cfg.model_name, grammars,
                          n_parallel, cfg.chat)
    return parse_openai_completion(body, bundle.tokenizer, cfg.defaults, cfg.model_name, grammars, n_parallel)


async def _serve(request: Request, chat: bool) -> Response:
    state: ServerState = request.app.state.server
    bundle, _ = state.require()
    cfg = state.config
    body = await read_json(request, cfg.body_limit, cfg.timeout)
    oa = await anyio.to_thread.run_sync(_prepare, state, body, chat)
    first = OpenAIFormatter(oa.job, oa.model, bundle.tokenizer, chat, oa.tools, oa.reasoning)
    fmts = [first] + [first.sibling(j) for j in oa.jobs[1:]]
    runs = submit_all(state, oa.jobs, log_state(request), oa.prompts)
    if oa.job.stream:
        return streamed(openai_stream(runs, fmts), runs, cfg.timeout, oa.job.sse_ping)
    return await respond(runs, request, lambda outs: JSONResp(
        merge_choices([f.full(o) for f, o in zip(fmts, outs)], oa.jobs)))


def merge_choices(bodies: list[dict], jobs) -> dict:
    """Several answers -> one OpenAI object: every choice by index, usage summed (each prompt
    counted once, as its choices share it)."""
    body = bodies[0]
    if len(bodies) == 1:
        return body
    body["choices"] = [c for b in bodies for c in b["choices"]]
    completion = sum(b["usage"]["completion_tokens"] for b in bodies)
    prompt = sum(b["usage"]["prompt_tokens"] for b, j in zip(bodies, jobs) if j.parent < 0)
    body["usage"] = {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
    return body


async def openai_stream(runs: list[Run], fmts: list[OpenAIFormatter]) -> AsyncIterator[bytes]:
    """Per choice: role chunk (chat), one chunk per token that completes text, the finish chunk;
    choices interleave, each chunk with its index; then the usage chunk if asked, and [DONE]."""
    if fmts[0].chat:
        for fmt in fmts:
            yield sse.event(fmt.role_chunk())
    pending: list[list[TokenEvent]] = [[] for _ in runs]
    finals: list[FinalEvent] = []
    async for i, ev in merged(runs):
        fmt = fmts[i]
        if isinstance(ev, TokenEvent):
            pending[i].append(ev)
            if ev.text:
                for chunk in fmt.stream_events(ev.text, pending[i]):
                    yield chunk
                pending[i] = []
        elif isinstance(ev, ProgressEvent):
            yield sse.event(fmt.progress_chunk(ev))
        elif isinstance(ev, FinalEvent):
            for chunk in fmt.stream_events(ev.text, pending[i], final=True):
                yield chunk
            yield sse.event(fmt.last_chunk(ev))
            if fmt.job.parent < 0:
                finals.append(dataclasses.replace(ev))
            else:
                finals.append(dataclasses.replace(ev, n_prompt=0))   # a shared prompt counts once
        else:
            yield sse.event(ApiError(500, ev.message, "server_error").body())
    if fmts[0].job.include_usage and finals:
        yield sse.event(fmts[0].usage_chunk(finals))
    yield sse.DONE


async def chat_input_tokens(request: Request) -> Response:
    """llama-server's /v1/chat/completions/input_tokens: the prompt a chat body would run, counted
    (rendered and tokenized exactly as the chat route does; nothing is generated)."""
    state: ServerState = request.app.state.server
    state.require()
    body = await read_json(request, state.config.body_limit, state.config.timeout)
    oa = await anyio.to_thread.run_sync(_prepare, state, {**body, "stream": False}, True)
    return JSONResp({"input_tokens": len(oa.job.request.prompt_ids)})


ROUTES = [
    Route("/v1/chat/completions/input_tokens", chat_input_tokens, methods=["POST"]),
    Route("/chat/completions/input_tokens", chat_input_tokens, methods=["POST"]),
    Route("/v1/completions", completions, methods=["POST"]),
    Route("/v1/chat/completions", chat_completions, methods=["POST"]),
    Route("/chat/completions", chat_completions, methods=["POST"]),
]
