"""After a step: advance counters, append sampled tokens, check stops, stream events out.

Stops, in llama-server's order: an end-of-generation token (unless `ignore_eos`), a stop string
(also across token boundaries; the text is cut before it), `n_predict` reached, the slot's
context full (`truncated`), or a code-completion line rule (`n_indent`, `t_max_predict_ms`:
engine/line_limits.py; "limit", as llama-server reports them). A constrained sequence also ends
("eos") once its grammar has accepted and allows nothing more; the token is fed to its matcher
here, after the step's masks were read.

The end-of-generation token is a step like any other for the client: it gets its TokenEvent (with
its probabilities, and the held-back text it releases; its own piece adds no text), then the
FinalEvent. llama-server's process_token does the same (the token joins `tokens`,
`completion_probabilities` and OpenAI's `logprobs`, and streams its own chunk), and a client that
scores answers or checks a model against llama.cpp step by step needs that last decision.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from slotserver.engine.request import ErrorEvent, FinalEvent, ProgressEvent, TokenEvent
from slotserver.engine.scheduler import Scheduler, StepPlan
from slotserver.engine.sequence import Sequence


@dataclass(frozen=True)
class Sampled:
    token: int
    logprob: float | None = None
    top: tuple[tuple[int, float], ...] = ()
    error: str = ""   # sampling failed for this row only (e.g. a bias that forbids every token)


def postprocess(sched: Scheduler, plan: StepPlan, sampled: list[tuple[Sampled, ...]],
                eog: frozenset[int]) -> list[Sequence]:
    """`sampled` has one run per chunk with `sample=True`, in plan order: one token, or a verified
    draft's (its drafts that matched, then the target's own token). -> finished sequences."""
    it = iter(sampled)
    done = []
    for chunk in plan.chunks:
        seq = chunk.seq
        seq.num_computed += chunk.n
        if seq.request.return_progress and chunk.start < seq.prompt_end and not seq.finished:
            seq.handle.emit(progress_event(seq))
        if not chunk.sample or seq.finished:
            continue
        run = next(it)
        for i, s in enumerate(run):
            seq.num_computed += i > 0   # the draft token before this one matched: its K/V is valid
            if _accept(sched, seq, s, eog):
                done.append(seq)
                break
            if i + 1 < len(run) and seq.reasoning is not None and not seq.reasoning.done:
                break   # a start tag in the run armed a reasoning budget: it must see the next token sampled
    return done


def _accept(sched: Scheduler, seq: Sequence, s: Sampled, eog: frozenset[int]) -> bool:
    if s.error:
        sched.finish(seq)
        seq.handle.emit(ErrorEvent(s.error))
        return True
    now = time.perf_counter()
    if not seq.t_prompt_done:
        seq.t_prompt_done = now
    seq.tokens.append(s.token)
    if seq.reasoning is not None:
        seq.reasoning.accept(s.token)
    req, lines = seq.request, seq.lines
    if s.token in eog and not req.ignore_eos:
        _end_of_generation(sched, seq, s)
        return True
    piece = seq.detok.push(s.token)
    indented = lines is not None and lines.feed(piece)
    text, word = seq.stops.feed(piece)
    if word is not None:
        seq.handle.emit(_token_event(seq, s, text))
        _finish(sched, seq, "word", word, False)
        return True
    complete = seq.grammar is not None and _grammar_done(seq.grammar, s.token)
    full = seq.num_tokens >= sched.config.n_cells and sched.shift is None   # else shifted next step
    limit = 0 <= req.n_predict <= seq.num_generated
    line_end = indented or (lines is not None and lines.sent(text, 1000 * (now - seq.t_prompt_done)))
    if full or limit or complete or line_end:
        text += seq.stops.feed(seq.detok.flush())[0] + seq.stops.flush()
    seq.handle.emit(_token_event(seq, s, text))
    if complete:
        _finish(sched, seq, "eos", "", False)
        return True
    if full or limit or line_end:
        _finish(sched, seq, "limit", "", full and not limit and not line_end)
        return True
    return False


def _end_of_generation(sched: Scheduler, seq: Sequence, s: Sampled) -> None:
    """The end token's event (the held text it releases) and the "eos" end. With --special the end
    token's own text ends the answer, its indentation and stop strings checked as on any text; a stop
    string found there still ends the answer as "eos", naming the word (llama-server's process_token
    sets STOP_TYPE_WORD, then STOP_TYPE_EOS for the end token)."""
    piece = seq.detok.flush() + (seq.detok.push(s.token) + seq.detok.flush() if seq.request.special else "")
    if seq.lines is not None:
        seq.lines.feed(piece)   # llama-server checks the indentation before the end token: its cut holds
    text, word = seq.stops.feed(piece)
    if word is not None:
        seq.handle.emit(_token_event(seq, s, text))
        _finish(sched, seq, "eos", word, False)
        return
    seq.handle.emit(_token_event(seq, s, text + seq.stops.flush()))
    _finish(sched, seq, "eos", "", False)


def progress_event(seq: Sequence, start: bool = False) -> ProgressEvent:
    """Prompt progress so far; `start`: the 0% update sent when the request gets its slot."""
    processed = seq.num_cached if start else min(seq.num_computed, seq.num_prompt)
    ms = 0.0 if start else 1000 * (time.perf_counter() - seq.t_start)
    timings = FinalEvent(stop_type="none", stopping_word="", truncated=False, id_slot=seq.slot_id, n_prompt=processed,
                         n_cached=seq.num_cached, n_predicted=0, prompt_ms=ms, predicted_ms=0.0, seed=seq.rng.seed)
    return ProgressEvent(seq.num_prompt, seq.num_cached, processed, ms, timings)


def _token_event(seq: Sequence, s: Sampled, text: str) -> TokenEvent:
    timings = final_event(seq, "none") if seq.request.timings_per_token else None
    return TokenEvent(s.token, text, s.logprob, s.top, timings)


def _grammar_done(matcher, token: int) -> bool:
    """Advance the matcher; True once it allows nothing more (accepted and complete)."""
    matcher.consume_token(token)
    return matcher.is_stopped()


def _finish(sched: Scheduler, seq: Sequence, stop_type: str, word: str, truncated: bool, tail: str = "") -> None:
    sched.finish(seq)
    seq.handle.emit(final_event(seq, stop_type, word, truncated, tail))


def final_event(seq: Sequence, stop_type: str, word: str = "", truncated: bool = False,
                tail: str = "") -> FinalEvent:
    now = time.perf_counter()
    prompt_done = seq.t_prompt_done or now
    return FinalEvent(
        stop_type=stop_type, stopping_word=word, truncated=truncated or seq.shifted, id_slot=seq.slot_id,
        n_prompt=seq.num_prompt, n_cached=seq.num_cached, n_predicted=max(0, seq.num_generated),
        prompt_ms=1000 * (prompt_done - seq.t_start) if seq.t_start else 0.0,
        predicted_ms=1000 * (now - prompt_done) if seq.t_prompt_done else 0.0,
        seed=seq.rng.seed, text=tail,
        draft_n=seq.spec.drafted if seq.spec else 0, draft_n_accepted=seq.spec.accepted if seq.spec else 0,
        cut=seq.lines.dropped() if seq.lines is not None and not word else 0,   # a stop string cut first
    )
