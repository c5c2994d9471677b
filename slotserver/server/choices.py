"""Several answers in one request: prompt lists and `n` choices (llama-server's `n_cmpl`).

A request becomes jobs, prompts x choices, in that order (`index` = prompt * n + choice). Choice 0
of a prompt is submitted as is; each further choice is a sibling: it shares choice 0's prefill
(the engine copies the prompt KV, see Scheduler), takes any free slot (`id_slot` applies to the
first only, as llama-server's child tasks), and with a fixed seed samples with seed + choice, so
the choices differ yet the whole answer is reproducible (llama-server copies the sampler state to
its children, which with a fixed seed would make them identical). n is limited to the number of
slots, as llama-server limits n_cmpl to n_parallel.

Answers: /completion gives one object for one job, else an array of them with `index`
(llama-server); the OpenAI routes give one object whose `choices` hold every job by `index`.
Streams interleave every job's chunks, each carrying its `index`.
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import AsyncIterator

from starlette.types import Receive

from slotserver.engine.request import Event
from slotserver.server.fields import Fields
from slotserver.server.generation import ClientGone, Outcome, Run, _gather, submit
from slotserver.server.job import CompletionJob
from slotserver.server.sse import EventStreamResponse, wait_for_disconnect
from slotserver.server.state import ServerState

SEED_MOD = 2**32


def n_choices(f: Fields, n_parallel: int, *names: str) -> int:
    for name in names:
        if f.has(name):
            return f.int(name, 1, lo=1, hi=max(1, n_parallel))
    return 1


def expand(jobs: list[CompletionJob], n: int) -> list[CompletionJob]:
    """One job per prompt -> prompts x n jobs with their index, parent and seed."""
    out: list[CompletionJob] = []
    for job in jobs:
        first = len(out)
        for j in range(n):
            r = job.request
            if j:
                params = r.params
                if params.seed != -1:
                    params = dataclasses.replace(params, seed=(params.seed + j) % SEED_MOD)
                r = dataclasses.replace(r, params=params, id_slot=-1)
            out.append(dataclasses.replace(job, request=r, index=len(out), parent=first if j else -1))
    return out


def submit_all(state: ServerState, jobs: list[CompletionJob], log_state: dict, prompts: list[str]) -> list[Run]:
    runs: list[Run] = []
    try:
        for job, prompt in zip(jobs, prompts):
            runs.append(submit(state, job, log_state, prompt, runs[job.parent] if job.parent >= 0 else None))
    except Exception:
        for run in runs:
            run.close()
        raise
    return runs


async def collect_all(runs: list[Run], receive: Receive) -> list[Outcome]:
    """Every job's whole result; ClientGone (after cancelling all) if the client leaves first."""
    gather = asyncio.ensure_future(asyncio.gather(*(_gather(r) for r in runs)))
    watch = asyncio.ensure_future(wait_for_disconnect(receive))
    try:
        await asyncio.wait({gather, watch}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watch.cancel()
        if not gather.done():
            gather.cancel()
    if gather.done() and not gather.cancelled():
        return gather.result()
    for run in runs:
        run.close()
    raise ClientGone()


async def merged(runs: list[Run]) -> AsyncIterator[tuple[int, Event]]:
    """(job index, event) from every run as they come; each run's events stay in order."""
    if len(runs) == 1:   # the usual request: no pump task and second queue, two task switches a token fewer
        events = runs[0].events()
        try:
            async for ev in events:
                yield 0, ev
        finally:
            await events.aclose()
        return
    queue: asyncio.Queue = asyncio.Queue()

    async def pump(i: int, run: Run) -> None:
        async for ev in run.events():
            await queue.put((i, ev))
        await queue.put((i, None))

    tasks = [asyncio.ensure_future(pump(i, r)) for i, r in enumerate(runs)]
    try:
        live = len(runs)
        while live:
            i, ev = await queue.get()
            if ev is None:
                live -= 1
            else:
                yield i, ev
    finally:
        for t in tasks:
            t.cancel()


def streamed(chunks: AsyncIterator[bytes], runs: list[Run], write_timeout: float, ping: float = -1) -> EventStreamResponse:
    """The SSE answer of `runs`; closing it cancels them. One run's backlog of events goes out in
    one write (sse.py, "Coalescing"); n > 1 merges several runs' events and sends each chunk.
    `ping`: seconds of silence before a ping (the request's sse_ping_interval; <= 0: none)."""
    response = EventStreamResponse(chunks, on_close=lambda: close_all(runs), write_timeout=write_timeout,
                                   ping_interval=ping)
    return response.gather_from(runs[0].handle) if len(runs) == 1 else response


def close_all(runs: list[Run]) -> None:
    for run in runs:
        run.close()

