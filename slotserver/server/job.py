"""One generation as a route runs it: the engine request plus how to answer it."""

from __future__ import annotations

from dataclasses import dataclass

from slotserver.engine.request import Request
from slotserver.model.sampling.params import MAX_N_PROBS
from slotserver.server.errors import bad_request


@dataclass(frozen=True)
class CompletionJob:
    """One generation as a route runs it: the engine request plus how to answer."""

    request: Request
    stream: bool = False
    return_tokens: bool = False
    n_probs: int = 0              # top probabilities the client asked for (0: none)
    want_logprobs: bool = False   # the client wants the chosen tokens' log-probabilities
    include_usage: bool = False   # OpenAI stream_options.include_usage
    index: int = 0                # this answer's place among the request's (prompts x n choices)
    parent: int = -1              # n > 1: the job (index) whose prompt prefill this one shares
    eog_bias: tuple[int, ...] = ()  # ignore_eos: the end-of-generation ids the engine biases to -inf
    response_fields: tuple[str, ...] = ()  # /completion: only these fields of the final answer ("a/b" nested)
    sse_ping: int = -1            # streamed: seconds of silence before a ping (sse_ping_interval; -1 none)

    def __post_init__(self) -> None:
        if not 0 <= self.n_probs <= MAX_N_PROBS:
            raise bad_request(f"'n_probs' must be in [0, {MAX_N_PROBS}], got {self.n_probs}")
