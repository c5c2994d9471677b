"""A request becoming a sequence: the checks a request passes before it is queued, and the
`Sequence` the engine schedules for it (its RNG, detokenizer, stop matcher, ignore_eos bias).

Why apart from the engine: these run on the caller's thread in `Engine.submit` (a bad request is
refused before it is queued, with a message naming what is wrong) and touch nothing of the
engine's state but its configuration.
"""

from __future__ import annotations

from slotserver.engine.config import EngineConfig
from slotserver.engine.reasoning_budget import ReasoningBudget
from slotserver.engine.request import ContextExceeded, RequestError, RequestHandle
from slotserver.engine.sequence import Sequence
from slotserver.engine.line_limits import LineLimits
from slotserver.engine.stop_strings import StopMatcher
from slotserver.model.sampling.sampler import SequenceRng
from slotserver.model.sampling.params import ignore_eos_params
from slotserver.model.text.detokenizer import IncrementalDetokenizer


def validate(request, config: EngineConfig, vocab: int) -> None:
    """Raise RequestError (ContextExceeded for a prompt that fills the slot) for a request the
    engine cannot run: an empty or too long prompt, token ids outside the vocabulary, a bad slot."""
    r = request
    if not r.prompt_ids:
        raise RequestError("the prompt is empty")
    if len(r.prompt_ids) >= config.n_cells:
        raise ContextExceeded(len(r.prompt_ids), config.n_cells)
    if any(not 0 <= t < vocab for t in r.prompt_ids):
        raise RequestError(f"prompt token ids must be in [0, {vocab})")
    if any(not 0 <= t < vocab for t, _ in r.params.logit_bias):
        raise RequestError(f"logit_bias token ids must be in [0, {vocab})")
    if not -1 <= r.id_slot < config.n_parallel:
        raise RequestError(f"id_slot must be -1 or in [0, {config.n_parallel})")
    if r.reasoning_budget is not None:
        r.reasoning_budget.check(vocab)


def new_sequence(handle: RequestHandle, eog: frozenset[int], tokenizer) -> Sequence:
    """The sequence of a validated request: `ignore_eos` becomes a -inf bias on every EOG token."""
    r = handle.request
    budget = r.reasoning_budget
    return Sequence(
        handle=handle, tokens=list(r.prompt_ids), num_prompt=len(r.prompt_ids),
        rng=SequenceRng(r.params.seed),
        params=ignore_eos_params(r.params, eog) if r.ignore_eos else r.params,
        detok=IncrementalDetokenizer(tokenizer, special=r.special), stops=StopMatcher(r.stop),
        reasoning=ReasoningBudget(budget, tokenizer.token_bytes) if budget is not None else None,
        lines=LineLimits.of(r.n_indent, r.t_max_predict_ms),
    )
