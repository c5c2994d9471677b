"""Stops and failures at the end of a sequence: held-back text is not lost, and a request whose
sampling fails ends alone with an error while the rest of its batch goes on."""

from __future__ import annotations

import math

from tiny_gguf import write_tiny_gguf

from slotserver.model.bundle import ModelBundle
from slotserver.model.config import ModelConfig
from slotserver.model.text.detokenizer import IncrementalDetokenizer
from slotserver.engine.engine import Engine
from slotserver.engine.config import EngineConfig
from slotserver.engine.postprocess import Sampled, postprocess
from slotserver.engine.request import ErrorEvent, FinalEvent, Request, RequestHandle, TokenEvent
from slotserver.model.sampling.sampler import SamplingParams, SequenceRng
from slotserver.engine.scheduler import Scheduler
from slotserver.engine.sequence import Sequence
from slotserver.engine.stop_strings import StopMatcher


def test_text_held_for_a_possible_stop_string_is_released_at_eos(tokenizer):
    sched = Scheduler(EngineConfig(n_parallel=1, ctx_size=64))
    req = Request((1, 2, 3), SamplingParams(temperature=0), stop=("\n\n",))
    handle = RequestHandle(1, req, engine=None)
    seq = Sequence(handle, [1, 2, 3], 3, SequenceRng(0), req.params, IncrementalDetokenizer(tokenizer), StopMatcher(req.stop))
    sched.add(seq)
    newline, eos = tokenizer.encode("Hi\n")[-1], 2
    for token in (tokenizer.encode("Hi")[0], newline, eos):
        plan = sched.schedule()
        postprocess(sched, plan, [(Sampled(token),)], tokenizer.eog_ids)
    result = handle.result(timeout=0)
    assert result.final.stop_type == "eos" and result.text == "Hi\n"


def test_the_eos_step_is_a_token_event_with_its_probabilities(tokenizer):
    """As llama-server's process_token: the end-of-generation token is reported like any step (its
    logprob and top alternatives, the held-back text it releases), then the final event."""
    sched = Scheduler(EngineConfig(n_parallel=1, ctx_size=64))
    req = Request((1, 2, 3), SamplingParams(temperature=0, n_probs=2), stop=("\n\n",))
    handle = RequestHandle(1, req, engine=None)
    seq = Sequence(handle, [1, 2, 3], 3, SequenceRng(0), req.params, IncrementalDetokenizer(tokenizer), StopMatcher(req.stop))
    sched.add(seq)
    hi, newline, eos = tokenizer.encode("Hi")[0], tokenizer.encode("Hi\n")[-1], 2
    for s in (Sampled(hi, -0.1, ((hi, -0.1), (7, -3.0))), Sampled(newline, -0.2, ((newline, -0.2), (7, -2.0))),
              Sampled(eos, -0.3, ((eos, -0.3), (newline, -1.5)))):
        postprocess(sched, sched.schedule(), [(s,)], tokenizer.eog_ids)
    *steps, final = list(handle.iter_events(timeout=0))
    assert all(isinstance(e, TokenEvent) for e in steps) and isinstance(final, FinalEvent)
    assert [e.token for e in steps] == [hi, newline, eos] and final.n_predicted == 3
    assert (steps[-1].text, steps[-1].logprob, steps[-1].top) == ("\n", -0.3, ((eos, -0.3), (newline, -1.5)))
    assert final.stop_type == "eos" and final.text == ""


def test_a_failing_row_fails_alone(tmp_path):
    b = ModelBundle.load(ModelConfig(model_path=write_tiny_gguf(tmp_path / "t.gguf")))
    engine = Engine(b, EngineConfig(n_parallel=2, ctx_size=256))
    forbid_all = SamplingParams(temperature=0, logit_bias=tuple((t, -math.inf) for t in range(b.model.spec.vocab_size)))
    bad = engine.submit(Request((5, 6, 7), forbid_all, n_predict=4))
    good = engine.submit(Request((5, 6, 8), SamplingParams(temperature=0), n_predict=4))
    while engine.step():
        pass
    assert isinstance(list(bad.iter_events(timeout=0))[-1], ErrorEvent)
    assert len(good.result(timeout=0).tokens) == 4
    assert engine.stats().n_active == 0
