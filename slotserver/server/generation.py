"""Running one engine request for a route: submit, consume its events, cancel when abandoned.

`Run` wraps a `RequestHandle`: its `events()` records latency metrics as events arrive and its
`close()` cancels the engine request unless it already finished (always call it: `finally`, or
the SSE response's `on_close`). `choices.collect_all()` gathers whole results for a non-streaming
answer while watching for the client leaving, so a client that times out frees its slot too.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import AsyncIterator

from slotserver.engine.request import (ContextExceeded, EngineBusy, ErrorEvent, Event, FinalEvent, RequestError, RequestHandle,
                                TokenEvent)
from slotserver.model.sampling.params import SamplingError
from slotserver.server.errors import ApiError
from slotserver.server.job import CompletionJob
from slotserver.server.state import ServerState


class ClientGone(Exception):
    """The client disconnected before the answer was ready (the request has been cancelled)."""


@dataclass
class Outcome:
    tokens: list[TokenEvent] = field(default_factory=list)
    text: str = ""
    final: FinalEvent | None = None

    @property
    def token_ids(self) -> list[int]:
        return [t.token for t in self.tokens]


class Run:
    def __init__(self, state: ServerState, handle: RequestHandle, log_state: dict) -> None:
        self.state, self.handle, self.log_state = state, handle, log_state
        self.t_submit = time.perf_counter()
        self.t_last: float | None = None
        self.finished = False

    async def events(self) -> AsyncIterator[Event]:
        metrics = self.state.metrics
        async for ev in self.handle.events():
            now = time.perf_counter()
            if isinstance(ev, TokenEvent):
                if self.t_last is None:
                    metrics.ttft.observe(now - self.t_submit)
                else:
                    metrics.itl.observe(now - self.t_last)
                self.t_last = now
            elif isinstance(ev, (FinalEvent, ErrorEvent)):
                self.finished = True
                if isinstance(ev, FinalEvent):
                    metrics.totals.add(ev)
                    self.log_state["tokens"] = (ev.n_prompt, ev.n_predicted)
            yield ev

    def close(self) -> None:
        if not self.finished:
            self.finished = True
            self.handle.cancel()
        self.state.forget_prompt(self.handle.id)


def busy_message(n_parallel: int, queue_limit: int) -> str:
    """The 503 a client sees when the wait queue is full, saying how the operator can raise it."""
    more = max(2 * queue_limit, queue_limit + 16)
    return (f"server is busy: all {n_parallel} slots are in use and the queue holds {queue_limit} waiting "
            f"requests, its limit; retry later, or start the server with --max-queue {more} to allow more")


def submit(state: ServerState, job: CompletionJob, log_state: dict, prompt_text: str = "",
           parent: Run | None = None) -> Run:
    """Hand the job to the engine; refusals become 400 (bad request) or 503 (queue full).
    `parent`: the run of an earlier choice of the same prompt, whose prefill this one shares."""
    _, engine = state.require()
    try:
        kw = {"parent": parent.handle} if parent is not None else {}
        handle = engine.submit(job.request, loop=asyncio.get_running_loop(), **kw)
    except ContextExceeded as e:
        raise ApiError(400, str(e), "exceed_context_size_error",
                       extra={"n_prompt_tokens": e.n_prompt, "n_ctx": e.n_ctx}) from None
    except (RequestError, SamplingError) as e:
        raise ApiError(400, str(e)) from None
    except EngineBusy:
        raise ApiError(503, busy_message(engine.config.n_parallel, engine.config.queue_limit)) from None
    state.remember_prompt(handle.id, prompt_text)
    return Run(state, handle, log_state)


async def _gather(run: Run) -> Outcome:
    out, texts = Outcome(), []
    async for ev in run.events():
        if isinstance(ev, TokenEvent):
            out.tokens.append(ev)
            texts.append(ev.text)
        elif isinstance(ev, ErrorEvent):
            raise ApiError(500, ev.message, "server_error")
        elif isinstance(ev, FinalEvent):
            out.final = ev
            texts.append(ev.text)
    out.text = "".join(texts)
    if out.final is not None and out.final.cut:   # n_indent: the whole answer ends where the rule cut it
        out.text = out.text[:max(0, len(out.text) - out.final.cut)]
    return out
