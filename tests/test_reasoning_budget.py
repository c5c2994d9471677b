"""The reasoning budget's state machine (engine/reasoning_budget.py) against llama.cpp's rules, and
the engine step that forces its tokens: one row forced while its batch neighbour samples freely.

Token ids here are arbitrary: START (1, 2, 3) opens the block, END (7, 8) closes it, MSG (9) is
the budget message, so the forced sequence is 9, 7, 8. `generate` plays the engine: a forced token
when the budget forces one, else the model's next token. HTTP: test_server_reasoning_budget.py.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from tiny_gguf import write_tiny_gguf

from slotserver.engine import step_sampling

from slotserver.engine.config import EngineConfig
from slotserver.engine.engine import Engine
from slotserver.engine.grammar import compile_constraint
from slotserver.engine.reasoning_budget import (COUNTING, DONE, FORCING, IDLE, WAITING_UTF8, BudgetSpec,
                                                ReasoningBudget, _Matcher, utf8_complete)
from slotserver.engine.request import ErrorEvent, Request, RequestError
from slotserver.model.bundle import ModelBundle
from slotserver.model.config import ModelConfig
from slotserver.model.sampling.sampler import SamplingParams

START, END, MSG = (1, 2, 3), (7, 8), (9,)
FORCED = MSG + END
PIECES = {200: b"\xc3", 201: b"\xa9", 202: b"\xc3\xa9"}   # a 2-byte character split, then whole


def budget(n: int, opened: bool = False, utf8: bool = False) -> ReasoningBudget:
    spec = BudgetSpec(n, (START,), (END,), FORCED, opened)
    return ReasoningBudget(spec, (lambda t: PIECES.get(t, b"a")) if utf8 else None)


def generate(rb: ReasoningBudget, model: list[int]) -> list[int]:
    """The tokens a sequence gets: forced ones where the budget forces, the model's elsewhere (a
    forced step uses no model token: the model would have said something else there)."""
    out, model = [], list(model)
    while model:
        token = rb.forced_token if rb.forced_token is not None else model.pop(0)
        rb.accept(token)
        out.append(token)
    return out


@pytest.mark.parametrize("n,expected", [
    (0, [5, *START, *FORCED, 4, 4, 4, 4, 4, 4]),     # 0: the end is forced right after the start tag
    (1, [5, *START, 4, *FORCED, 4, 4, 4, 4, 4]),
    (3, [5, *START, 4, 4, 4, *FORCED, 4, 4, 4]),
    (9, [5, *START, 4, 4, 4, 4, 4, 4]),              # the model still thinks, within its budget
])
def test_n_tokens_after_a_multi_token_start_tag_then_message_and_end(n, expected):
    assert generate(budget(n), [5, *START, 4, 4, 4, 4, 4, 4]) == expected


def test_the_model_ending_the_block_itself_stops_counting():
    rb = budget(4)
    assert generate(rb, [*START, 4, 4, *END, 4, 4, 4, 4, 4]) == [*START, 4, 4, *END, 4, 4, 4, 4, 4]
    assert rb.state == DONE and rb.done


def test_an_end_tag_cut_by_the_budget_is_forced_whole():
    assert generate(budget(2), [*START, 4, 7, 7, 7]) == [*START, 4, 7, *FORCED, 7, 7]   # 7 alone is no end


def test_states_and_what_each_forces():
    rb = budget(1)
    assert (rb.state, rb.forced_token, rb.done) == (IDLE, None, True)
    for t in START:
        rb.accept(t)
    assert (rb.state, rb.remaining, rb.forced_token, rb.done) == (COUNTING, 1, None, False)
    rb.accept(4)
    seen = []
    while rb.forced_token is not None:
        seen.append((rb.state, rb.forced_token, rb.done))
        rb.accept(rb.forced_token)
    assert seen == [(FORCING, t, False) for t in FORCED] and rb.state == DONE and rb.done
    for t in START:
        rb.accept(t)
    assert not rb.done   # re-armed


def test_done_passes_everything_and_a_new_block_gets_a_fresh_budget():
    rb = budget(2)
    out = generate(rb, [*START, 4, 4, 4, 4, 5, 5, *START, 6, 6, 6])
    assert out == [*START, 4, 4, *FORCED, 4, 4, 5, 5, *START, 6, 6, *FORCED, 6]


def test_a_prompt_that_opened_the_block_counts_from_the_first_token():
    assert generate(budget(2, opened=True), [4, 4, 4, 4]) == [4, 4, *FORCED, 4, 4]
    assert generate(budget(0, opened=True), [4, 4]) == [*FORCED, 4, 4]    # 0: forced from the first step
    assert budget(0, opened=True).state == FORCING


def test_the_budget_waits_for_a_token_that_ends_a_character():
    """llama.cpp judges each token's own bytes: a lone continuation byte (201) ends nothing, so the
    wait lasts until a token whose piece ends a whole character."""
    rb = budget(2, utf8=True)
    assert generate(rb, [*START, 4, 200, 201, 4, 4]) == [*START, 4, 200, 201, 4, *FORCED, 4]
    rb = budget(2, utf8=True)
    assert generate(rb, [*START, 4, 202, 4]) == [*START, 4, 202, *FORCED, 4]   # whole: no wait
    rb = ReasoningBudget(BudgetSpec(1, (START,), ((8,), END), FORCED), lambda t: PIECES.get(t, b"a"))
    for t in (*START, 200):
        rb.accept(t)
    assert rb.state == WAITING_UTF8 and rb.forced_token is None
    rb.accept(8)
    assert rb.state == DONE and rb.forced_token is None   # the model's own end while waiting


@pytest.mark.parametrize("piece,whole", [(b"", True), (b"a", True), (b"\xc3\xa9", True), (b"\xc3", False),
                                         (b"\xa9", False), (b"\xe2\x82", False), (b"\xe2\x82\xac", True),
                                         (b"x\xf0\x9f\x98", False), (b"\xf0\x9f\x98\x80", True)])
def test_utf8_completion_as_llama_cpp(piece, whole):
    assert utf8_complete(piece) is whole


def test_the_longest_sequence_ending_here_wins_and_matching_restarts():
    m = _Matcher([(8,), (7, 8), (8,), ()])       # duplicates and empties dropped, as llama.cpp
    assert m.seqs == ((8,), (7, 8))
    assert [m.advance(t) for t in (7, 8, 8, 5, 7, 7, 8)] == [-1, 1, 0, -1, -1, -1, 1]


def test_a_spec_is_checked():
    with pytest.raises(RequestError, match="budget"):
        BudgetSpec(-1, (START,), (END,), FORCED)
    with pytest.raises(RequestError, match="start and end"):
        BudgetSpec(3, ((),), (END,), FORCED)
    with pytest.raises(RequestError, match=r"\[0, 8\)"):
        BudgetSpec(3, (START,), (END,), FORCED).check(8)


# ---------------------------------------------------------------------------------------------
# the engine: forced rows in a batch

@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    bundle = ModelBundle.load(ModelConfig(model_path=write_tiny_gguf(tmp_path_factory.mktemp("rb") / "t.gguf"),
                                          threads=1))
    yield Engine(bundle, EngineConfig(n_parallel=2, ctx_size=256))


def run(engine: Engine, *requests: Request) -> list:
    handles = [engine.submit(r) for r in requests]
    while engine.step():
        pass
    return [h.result(timeout=0) for h in handles]


def test_a_forced_row_beside_a_free_one(engine):
    free = Request((5, 6, 7), SamplingParams(temperature=0, n_probs=2), n_predict=8)
    alone = run(engine, free)[0].tokens
    spec = BudgetSpec(2, ((60,),), ((61, 62),), (63, 61, 62), opened=True)
    params = SamplingParams(temperature=0.9, seed=4, n_probs=2)
    forced, beside = run(engine, Request((5, 6, 8), params, n_predict=8, reasoning_budget=spec), free)
    assert beside.tokens == alone                       # the neighbour's row is untouched
    assert forced.tokens[2:5] == [63, 61, 62] and len(forced.tokens) == 8
    sampled = run(engine, Request((5, 6, 8), params, n_predict=2))[0].tokens
    assert forced.tokens[:2] == sampled                 # same seed: the free steps draw as without a budget


def test_on_the_device_path_a_forcing_row_goes_to_the_host_and_gets_its_token():
    """The GPU's split (run on CPU tensors): the forcing row is copied to the host sampler and gets
    its forced token; its neighbour is sampled by the device sampler (its argmax)."""
    forcing = budget(0, opened=True)
    seqs = [SimpleNamespace(reasoning=None, params=SamplingParams(temperature=0), rng=None, tokens=[]),
            SimpleNamespace(reasoning=forcing, params=SamplingParams(temperature=0), rng=None, tokens=[])]
    plan = SimpleNamespace(chunks=[SimpleNamespace(sample=True, seq=s, draft=()) for s in seqs])
    logits = torch.zeros(2, 16)
    logits[0, 11] = logits[1, 12] = 5.0
    out = step_sampling.StepSampling(16, on_device=True).sample(plan, logits, None)
    assert [run[0].token for run in out] == [11, FORCED[0]]


def test_a_grammar_that_forbids_the_forced_token_fails_that_request_alone(engine):
    spec = BudgetSpec(0, ((60,),), ((61,),), (61,), opened=True)
    handle = engine.submit(Request((5, 6, 8), SamplingParams(temperature=0), n_predict=4, reasoning_budget=spec,
                                   grammar=compile_constraint("gbnf", 'root ::= "a"+')))
    good = engine.submit(Request((5, 6, 7), SamplingParams(temperature=0), n_predict=4))
    while engine.step():
        pass
    assert isinstance(list(handle.iter_events(timeout=0))[-1], ErrorEvent)
    assert len(good.result(timeout=0).tokens) == 4


def test_token_ids_outside_the_vocabulary_are_refused(engine):
    spec = BudgetSpec(1, ((60,),), ((10**6,),), (10**6,))
    with pytest.raises(RequestError, match="reasoning budget token ids"):
        engine.submit(Request((5, 6), reasoning_budget=spec))
