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

from slotserver.engine.request import FinalEvent, ProgressEvent, TokenEvent
from slotserver.server import sse
from slotserver.server.body import read_json
from slotserver.server.errors import ApiError
from slotserver.server.formats import llama
from slotserver.server.choices import close_all, collect_all, merged, streamed, submit_all
from slotserver.server.generation import ClientGone, Outcome, Run
from slotserver.server.jsonio import JSONResp
from slotserver.server.params import CompletionJob, parse_completion
from slotserver.server.prompt import prompt_text
from slotserver.server.state import ServerState
from slotserver.model.text.tokenizer import Tokenizer

CLIENT_CLOSED = 499  # nginx's status for "client closed the request"; only seen in our log


async def respond(runs: list[Run], request: Request, render: Callable[[list[Outcome]], Response]) -> Response:
    """A non-streaming answer: wait for every generation (all cancelled if the client leaves)."""
    try:
        outs = await collect_all(runs, request.receive)
    except ClientGone:
        return Response(status_code=CLIENT_CLOSED)
    finally:
        close_all(runs)
    return render(outs)


def log_state(request: Request) -> dict:
    """The per-request dict the access log reads (token counts)."""
    return request.scope.setdefault("state", {})


async def completion(request: Request) -> Response:
    state: ServerState = request.app.state.server
    bundle, engine = state.require()
    cfg = state.config
    body = await read_json(request, cfg.body_limit, cfg.timeout)

    def prepare() -> tuple[list[CompletionJob], list[str]]:
        jobs = parse_completion(body, bundle.tokenizer, cfg.defaults, getattr(engine, "grammars", None),
                                engine.config.n_parallel)
        return jobs, [prompt_text(bundle.tokenizer, j.request.prompt_ids) for j in jobs]

    jobs, prompts = await anyio.to_thread.run_sync(prepare)
    return await run_llama_jobs(request, state, jobs, prompts)


async def run_llama_jobs(request: Request, state: ServerState, jobs: list[CompletionJob],
                         prompts: list[str]) -> Response:
    """Submit parsed /completion-style jobs and answer in llama-server's shape, streamed or whole
    (/completion and /infill)."""
    tokenizer, cfg = state.bundle.tokenizer, state.config
    runs = submit_all(state, jobs, log_state(request), prompts)
    if jobs[0].stream:
        chunks = llama_stream(runs, jobs, tokenizer, cfg.model_name, prompts)
        return streamed(chunks, runs, cfg.timeout, jobs[0].sse_ping)

    def render(outs: list[Outcome]) -> Response:
        bodies = [llama.final_response(j, o, tokenizer, cfg.model_name, p) for j, o, p in zip(jobs, outs, prompts)]
        return JSONResp(bodies[0] if len(bodies) == 1 else bodies)   # llama-server: an array for several
    return await respond(runs, request, render)


async def llama_stream(runs: list[Run], jobs: list[CompletionJob], tokenizer: Tokenizer, model: str,
                       prompts: list[str]) -> AsyncIterator[bytes]:
    """Per job: one chunk per token that completes text (or carries probabilities); then its summary
    chunk. Several jobs interleave, each chunk with its `index`.

    A token whose text is held back (half a UTF-8 character, a possible stop string) rides along
    with the next chunk that has text, so every generated token id is sent exactly once.
    """
    pending: list[list[TokenEvent]] = [[] for _ in runs]
    counts = [0] * len(runs)
    streams = [llama.StreamEvents(job, tokenizer) for job in jobs]
    async for i, ev in merged(runs):
        job = jobs[i]
        if isinstance(ev, TokenEvent):
            counts[i] += 1
            pending[i].append(ev)
            if ev.text or job.n_probs > 0:
                yield streams[i].event(ev.text, pending[i], counts[i])
                pending[i] = []
        elif isinstance(ev, ProgressEvent):
            yield sse.event(llama.progress_chunk(job, ev))
        elif isinstance(ev, FinalEvent):
            if pending[i] or ev.text:
                yield streams[i].event(ev.text, pending[i], counts[i])
            yield sse.event(llama.final_chunk(job, ev, model, prompts[i]))
        else:
            yield sse.event(ApiError(500, ev.message, "server_error").body())


ROUTES = [
    Route("/completion", completion, methods=["POST"]),
    Route("/completions", completion, methods=["POST"]),
]
