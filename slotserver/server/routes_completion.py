"""POST /completion (and /completions): llama-server's native completion API, streaming or not.

Everything that can be refused is refused before the first byte of a stream: body, parameters,
prompt tokenization, and the engine's own checks at submit (prompt longer than a slot's context,
bad id_slot, queue full). After that, a stream only ends early when the client leaves.
"""

from __future__ import annotations

from typing import AsyncIterator, Callable

import anyio
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from slotserver.engine.request import FinalEvent, TokenEvent
from slotserver.server import format_llama, sse
from slotserver.server.body import read_json
from slotserver.server.errors import ApiError
from slotserver.server.generation import ClientGone, Outcome, Run, collect, submit
from slotserver.server.jsonio import JSONResp
from slotserver.server.params import CompletionJob, parse_completion
from slotserver.server.state import ServerState
from slotserver.model.text.tokenizer import Tokenizer

CLIENT_CLOSED = 499  # nginx's status for "client closed the request"; only seen in our log


async def respond(run: Run, request: Request, render: Callable[[Outcome], Response]) -> Response:
    """A non-streaming answer: wait for the whole generation (cancelled if the client leaves)."""
    try:
        out = await collect(run, request.receive)
    except ClientGone:
        return Response(status_code=CLIENT_CLOSED)
    finally:
        run.close()
    return render(out)


def log_state(request: Request) -> dict:
    """The per-request dict the access log reads (token counts)."""
    return request.scope.setdefault("state", {})


async def completion(request: Request) -> Response:
    state: ServerState = request.app.state.server
    bundle, engine = state.require()
    cfg = state.config
    body = await read_json(request, cfg.body_limit, cfg.timeout)

    def prepare() -> tuple[CompletionJob, str]:
        job = parse_completion(body, bundle.tokenizer, cfg.defaults, getattr(engine, "grammars", None))
        return job, bundle.tokenizer.decode(job.request.prompt_ids, special=True)

    job, prompt = await anyio.to_thread.run_sync(prepare)
    run = submit(state, job, log_state(request), prompt)
    if job.stream:
        chunks = llama_stream(run, job, bundle.tokenizer, cfg.model_name, prompt)
        return sse.EventStreamResponse(chunks, on_close=run.close, write_timeout=cfg.timeout)
    return await respond(run, request, lambda out: JSONResp(
        format_llama.final_response(job, out, bundle.tokenizer, cfg.model_name, prompt)))


async def llama_stream(run: Run, job: CompletionJob, tokenizer: Tokenizer, model: str,
                       prompt: str) -> AsyncIterator[bytes]:
    """One chunk per token that completes text (or carries probabilities); then the summary chunk.

    A token whose text is held back (half a UTF-8 character, a possible stop string) rides along
    with the next chunk that has text, so every generated token id is sent exactly once.
    """
    pending: list[TokenEvent] = []
    n = 0
    async for ev in run.events():
        if isinstance(ev, TokenEvent):
            n += 1
            pending.append(ev)
            if ev.text or job.n_probs > 0:
                yield sse.event(format_llama.stream_chunk(job, ev.text, pending, tokenizer, n))
                pending = []
        elif isinstance(ev, FinalEvent):
            if pending or ev.text:
                yield sse.event(format_llama.stream_chunk(job, ev.text, pending, tokenizer, n))
            yield sse.event(format_llama.final_chunk(job, ev, model, prompt))
        else:
            yield sse.event(ApiError(500, ev.message, "server_error").body())


ROUTES = [
    Route("/completion", completion, methods=["POST"]),
    Route("/completions", completion, methods=["POST"]),
]
