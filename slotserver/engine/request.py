"""What a client submits to the engine and what it gets back: a request, its events, its handle.

The engine thread emits events into the handle; an asyncio consumer receives them through the
engine's `Outbox` (at most one `loop.call_soon_threadsafe` per step, never touching engine state),
a plain thread through a queue.
"""

from __future__ import annotations

import asyncio
import queue
from dataclasses import dataclass, field
from typing import AsyncIterator, Awaitable, Callable, Iterator, Union

from slotserver.engine.outbox import Outbox
from slotserver.errors import EngineBusy, RequestError  # noqa: F401  re-export: defined without torch in slotserver.errors
from slotserver.engine.reasoning_budget import BudgetSpec
from slotserver.model.sampling.params import SamplingParams


class ContextExceeded(RequestError):
    """The prompt does not fit a slot's context (llama-server's exceed_context_size_error)."""

    def __init__(self, n_prompt: int, n_ctx: int) -> None:
        super().__init__(f"the request exceeds the available context size, try increasing it: the prompt has "
                         f"{n_prompt} tokens, a slot's context is {n_ctx}")
        self.n_prompt, self.n_ctx = n_prompt, n_ctx


@dataclass(frozen=True)
class Request:
    prompt_ids: tuple[int, ...]
    params: SamplingParams = field(default_factory=SamplingParams)
    n_predict: int = -1            # -1: until end of generation or a full context
    n_keep: int = 0                # context shift: tokens kept at the start (-1: the whole prompt)
    n_discard: int = 0             # context shift: tokens dropped after them (0: half of the rest)
    n_cache_reuse: int | None = None   # cache reuse's least chunk (0: off; None: the engine's --cache-reuse)
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False
    id_slot: int = -1              # -1: choose by prompt similarity, then least recently used
    cache_prompt: bool = True
    grammar: str | None = None     # llguidance grammar text (compiled and checked by the server)
    return_progress: bool = False  # ProgressEvents while the prompt is computed (llama-server's return_progress)
    timings_per_token: bool = False  # every TokenEvent carries the timings so far
    # llama-server's `speculative.n_max/n_min/p_min`: this request's draft sizes (None: the server's);
    # n_max 0 turns speculation off for it
    spec_n_max: int | None = None
    spec_n_min: int | None = None
    spec_p_min: float | None = None
    reasoning_budget: BudgetSpec | None = None  # tokens allowed inside <think> (reasoning_budget.py)
    # llama-server's `lora`: (adapter id, scale) pairs for this request, the others at 0; None (or
    # empty): the server's scales when submitted (engine/lora_scales.py)
    lora: tuple[tuple[int, float], ...] | None = None
    # llama-server's code-completion line rules (engine/line_limits.py): 0 / -1 off
    n_indent: int = 0
    t_max_predict_ms: int = -1
    special: bool = False          # --special: control tokens' text (<|im_end|>...) in the answer and its probabilities


@dataclass(frozen=True)
class TokenEvent:
    token: int
    text: str                                   # newly completed text (may be "" while held back)
    logprob: float | None = None
    top: tuple[tuple[int, float], ...] = ()     # n_probs best (token, logprob), best first
    timings: "FinalEvent | None" = None         # with timings_per_token: the counters so far


@dataclass(frozen=True)
class FinalEvent:
    stop_type: str          # "eos" | "limit" | "word" | "none" (cancelled)
    stopping_word: str
    truncated: bool         # stopped because the slot's context is full
    id_slot: int
    n_prompt: int           # tokens_evaluated
    n_cached: int           # prompt tokens reused from the slot's cache
    n_predicted: int
    prompt_ms: float
    predicted_ms: float
    seed: int
    text: str = ""          # text held back until the end (a partial stop string, half a character)
    draft_n: int = 0        # speculative decoding: draft tokens proposed (llama-server's timings.draft_n)
    draft_n_accepted: int = 0
    cut: int = 0            # n_indent: characters at the end of the sent text the whole answer leaves out


@dataclass(frozen=True)
class ProgressEvent:
    """Prompt processing progress (return_progress): llama-server's prompt_progress and timings."""

    total: int              # prompt tokens
    cache: int              # reused from the slot's cache
    processed: int          # computed so far (cache included)
    time_ms: float          # since the request was scheduled
    timings: FinalEvent     # the counters so far, for the chunk's `timings`


@dataclass(frozen=True)
class ErrorEvent:
    message: str


Event = Union[TokenEvent, ProgressEvent, FinalEvent, ErrorEvent]
END_EVENTS = (FinalEvent, ErrorEvent)


class RequestHandle:
    """The client's end of one request: iterate its events (async or sync), or cancel it."""

    def __init__(self, request_id: int, request: Request, engine, loop: asyncio.AbstractEventLoop | None = None,
                 outbox: Outbox | None = None):
        assert loop is None or outbox is not None, "an asyncio consumer's events go through the engine's outbox"
        self.id, self.request, self._engine, self._loop = request_id, request, engine, loop
        self._outbox = outbox
        self.seq = None   # the engine's Sequence (set by Engine.submit; read on the engine thread only)
        self._sync: queue.SimpleQueue[Event] = queue.SimpleQueue()
        self._async: asyncio.Queue[Event] | None = asyncio.Queue() if loop is not None else None
        # awaited by `events()` just before it waits for the engine (nothing queued): a streamed
        # response sends what it has gathered from the events already there (server/sse.py)
        self.before_wait: Callable[[], Awaitable[None]] | None = None

    def emit(self, event: Event) -> None:
        """Called on the engine thread. An asyncio consumer gets it when the engine flushes its outbox
        (end of step); a thread consumer at once."""
        if self._async is not None:
            self._outbox.put(self._loop, self._async, event)
        else:
            self._sync.put(event)

    def cancel(self) -> None:
        self._engine.cancel(self.id)

    async def events(self) -> AsyncIterator[Event]:
        assert self._async is not None, "submit(..., loop=...) to consume events asynchronously"
        events = self._async
        while True:
            if self.before_wait is not None and events.empty():
                await self.before_wait()
            event = await events.get()
            yield event
            if isinstance(event, END_EVENTS):
                return

    def iter_events(self, timeout: float | None = None) -> Iterator[Event]:
        while True:
            event = self._sync.get(timeout=timeout)
            yield event
            if isinstance(event, END_EVENTS):
                return

    def result(self, timeout: float | None = None) -> "Completion":
        tokens, texts, final = [], [], None
        for ev in self.iter_events(timeout):
            if isinstance(ev, TokenEvent):
                tokens.append(ev.token)
                texts.append(ev.text)
            elif isinstance(ev, ErrorEvent):
                raise RuntimeError(ev.message)
            elif isinstance(ev, FinalEvent):
                final = ev
                texts.append(ev.text)
        return Completion(tokens, "".join(texts), final)


@dataclass
class Completion:
    tokens: list[int]
    text: str
    final: FinalEvent
