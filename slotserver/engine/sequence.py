"""One request in flight: its tokens and counters, and its output state.

A sequence carries counters, not phases: `num_computed` tokens have their KV in the slot's stream,
`num_tokens` exist (prompt + generated, less what a context shift dropped). Prefill, chunked
prefill and decode only differ in how many of the `num_tokens - num_computed` pending tokens a
step schedules.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from slotserver.engine.line_limits import LineLimits
from slotserver.engine.reasoning_budget import ReasoningBudget
from slotserver.engine.request import Request, RequestHandle
from slotserver.engine.stop_strings import StopMatcher
from slotserver.model.sampling.params import SamplingParams
from slotserver.model.text.detokenizer import IncrementalDetokenizer

if TYPE_CHECKING:  # the engine makes the rng; a sequence only carries it (the sampler module imports torch)
    from slotserver.model.sampling.sampler import SequenceRng
    from slotserver.engine.speculative.speculator import SpecState


@dataclass
class Sequence:
    handle: RequestHandle
    tokens: list[int]               # prompt + generated
    num_prompt: int
    rng: SequenceRng
    params: SamplingParams          # the request's, plus -inf bias on end-of-generation if ignore_eos
    detok: IncrementalDetokenizer
    stops: StopMatcher
    arrival: float = field(default_factory=time.perf_counter)
    slot_id: int = -1
    num_computed: int = 0           # tokens whose K/V are in the stream
    num_cached: int = 0             # prompt tokens reused from the slot's cache
    t_start: float = 0.0            # first scheduled
    t_prompt_done: float = 0.0      # first token sampled
    finished: bool = False
    grammar: object | None = None   # the request's llguidance LLMatcher, made on the engine thread
    parent: Sequence | None = None  # n > 1: the sibling whose prompt KV this one copies (see Scheduler)
    spec: SpecState | None = None   # speculative decoding's totals and adaptive cap (engine/speculative)
    reasoning: ReasoningBudget | None = None  # the request's reasoning budget state (fed in postprocess)
    # context shift (engine/context_shift.py): tokens dropped from `tokens` (and the KV), still counted
    num_discarded: int = 0          # all of them
    num_prompt_discarded: int = 0   # of which prompt tokens
    shifted: bool = False           # a shift ran: the response says truncated (as llama-server)
    # LoRA (engine/lora_scales.py): each adapter's scale for this request (() with none active), and
    # the name of the KV computed under them: caches only give a prefix computed under the same
    lora: tuple[float, ...] = ()
    cache_ns: str = ""
    lines: LineLimits | None = None   # n_indent / t_max_predict_ms (engine/line_limits.py), fed in postprocess

    @property
    def request(self) -> Request:
        return self.handle.request

    @property
    def id(self) -> int:
        return self.handle.id

    @property
    def num_tokens(self) -> int:
        return len(self.tokens)

    @property
    def num_pending(self) -> int:
        return len(self.tokens) - self.num_computed

    @property
    def num_generated(self) -> int:
        """Every generated token, those a context shift dropped from `tokens` included."""
        return len(self.tokens) + self.num_discarded - self.num_prompt

    @property
    def prompt_end(self) -> int:
        """Where the prompt ends in `tokens`: `num_prompt` until a context shift drops prompt tokens."""
        return self.num_prompt - self.num_prompt_discarded

    @property
    def computed_tokens(self) -> list[int]:
        """The tokens whose KV is valid in the stream: what the slot caches after this request."""
        return self.tokens[: self.num_computed]
