"""Overlapped decode steps (--async-steps, engine/overlap.py) on the CPU, forced on: what a client
sees is what it sees with overlap off, token for token, through stops, limits, cancels, n_probs and
the slot caches. The logic is device-agnostic; on the CPU the forward blocks, so only the order of
the host's work changes. tests/test_device.py runs the engine on CUDA with the default (auto: on)."""

from __future__ import annotations

import time

import pytest
import torch
from async_steps_fixtures import GREEDY, drive, make_engine, model_path, one_torch_thread, prompts, same_answers  # noqa: F401

from slotserver.engine.config import EngineConfig
from slotserver.engine.request import Request
from slotserver.engine.sampled_ids import SampledIds
from slotserver.errors import ConfigError
from slotserver.model.sampling.params import SamplingParams


@pytest.mark.parametrize("layout", ["seq_head_dim", "paged"])
def test_mixed_requests_match_overlap_off(model_path, layout):
    """Arrivals at different steps, more requests than slots, end-of-generation, stop strings,
    max_tokens, a cancel, a full slot: every answer and every slot's cache as with overlap off."""
    free = drive(make_engine(model_path, "off", layout), {0: [Request(p, GREEDY, n_predict=40) for p in prompts(7)]})
    eog = frozenset({free[0][0][9]})   # the random model's 10th token of the first prompt ends generation
    text = free[5][1]
    word = next(w for w in (text[i: i + 2] for i in range(4, len(text))) if w.isascii() and w.isprintable())
    ps = prompts(7)
    script = {0: [Request(ps[0], GREEDY, n_predict=30), Request(ps[1], GREEDY, n_predict=25)],
              2: [Request(ps[2], GREEDY, n_predict=12), Request(ps[3], GREEDY, n_predict=-1)],
              5: [Request(ps[4], GREEDY, n_predict=9, ignore_eos=True)],
              9: [Request(ps[5], GREEDY, n_predict=20, stop=(word,)), ("cancel", 2)],
              11: [Request(ps[6], GREEDY, n_predict=17)]}
    runs, engines = [], []
    for mode in ("off", "on"):
        engines.append(make_engine(model_path, mode, layout, eog))
        runs.append(drive(engines[-1], script))
    off, on = runs
    same_answers(off, on)
    stops = {f.stop_type for _, _, f, _ in on}
    assert {"eos", "word", "limit", "none"} <= stops, stops
    assert any(f.truncated for _, _, f, _ in on), "a request should fill its slot"
    assert engines[1].overlap.launched > 20 and engines[1].overlap.discarded > 0
    assert engines[0].overlap.launched == 0
    assert [s.cached for s in engines[0].sched.slots.slots] == [s.cached for s in engines[1].sched.slots.slots]
    assert not engines[1].sched.has_work() and engines[1].overlap.in_flight is None


@pytest.mark.parametrize("stop", ["eos", "word", "limit"])
def test_a_stopped_request_keeps_no_extra_token(model_path, stop):
    """The row an overlapped step computed after the stop is never shown nor cached: the slot keeps
    the prompt and every generated token but the last (whose K/V was never computed), as with
    overlap off; the next request with that prefix reuses exactly that."""
    p = prompts(3)[2]
    ref = drive(make_engine(model_path, "off", n_parallel=1, ctx_size=64), {0: [Request(p, GREEDY, n_predict=20)]})
    tokens, text = ref[0][0], ref[0][1]
    k = 6
    kw = {"eos": {}, "word": {"stop": (text[len(text) // 2: len(text) // 2 + 2],)}, "limit": {"n_predict": k}}[stop]
    eog = frozenset({tokens[k]}) if stop == "eos" else frozenset()
    engine = make_engine(model_path, "on", n_parallel=1, ctx_size=64, eog=eog)
    req = Request(p, GREEDY, **({"n_predict": 20} | kw))
    got, _, final, _ = drive(engine, {0: [req]})[0]
    assert final.stop_type == stop and got == tokens[: len(got)] and final.n_predicted == len(got)
    assert engine.sched.slots.slots[0].cached == list(p) + got[:-1]
    assert engine.overlap.discarded == (stop != "limit")   # a known limit is not launched past
    again = drive(engine, {0: [Request(tuple(p) + tuple(got) + (5, 6), GREEDY, n_predict=2)]})[0][2]
    assert again.n_cached == len(p) + len(got) - 1


@pytest.mark.parametrize("defrag", ["off", "on"])
def test_the_pipeline_runs_on_through_finished_requests(model_path, defrag):
    """Requests that end (on max_tokens, known ahead, or on an end of generation, seen one step late)
    leave the overlapped steps running for the others: after the prompt's step and the first
    decode step, every step of the longest request is launched ahead; answers as with overlap off.
    With defrag on, the two that end sit on streams below the longest one's, which the scheduler
    then moves down: each costs one step that lands before it is scheduled."""
    ps = prompts(3)
    lengths = (5, 9, 20)
    reqs = [Request(p, GREEDY, n_predict=n) for p, n in zip(ps, lengths)]
    off = drive(make_engine(model_path, "off"), {0: reqs})
    mid, last = off[1][0], off[2][0]
    k = next(i for i in range(2, len(mid)) if mid[i] not in mid[:i] + last + off[0][0])   # ends only request 1
    runs, engines = [], []
    for mode in ("off", "on"):
        engines.append(make_engine(model_path, mode, eog=frozenset({mid[k]}), defrag=defrag))
        runs.append(drive(engines[-1], {0: reqs}))
    same_answers(*runs)
    assert [f.stop_type for _, _, f, _ in runs[1]] == ["limit", "eos", "limit"]
    assert engines[1].overlap.launched == lengths[-1] - 2 - 2 * (defrag == "on") and engines[1].overlap.discarded == 1


def test_steps_compute_the_batches_of_overlap_off(model_path):
    """Where every stop is known ahead (max_tokens, a full slot) and one request is cancelled, the
    overlapped engine runs the very batches of overlap off, step for step (the same sequences,
    positions and admissions: the same floats on any device), only launched earlier."""
    ps = prompts(7)
    script = {0: [Request(p, GREEDY, n_predict=n, ignore_eos=True) for p, n in zip(ps[:4], (6, 14, 3, -1))],
              4: [Request(ps[4], GREEDY, n_predict=8, ignore_eos=True), ("cancel", 1)],
              7: [Request(p, GREEDY, n_predict=n, ignore_eos=True) for p, n in zip(ps[5:], (5, 11))]}
    batches, engines = [], []
    for mode in ("off", "on"):
        engine, seen = make_engine(model_path, mode), []
        forward = engine._forward
        engine._forward = lambda plan, tokens=None, f=forward, seen=seen: (
            seen.append([(c.seq.id, c.start, c.n, c.stream) for c in plan.chunks]), f(plan, tokens))[1]
        drive(engine, script)
        batches.append(seen)
        engines.append(engine)
    assert batches[0] == batches[1]
    assert engines[1].overlap.launched > len(batches[0]) // 2 and engines[1].overlap.discarded == 0


def test_context_shift_matches_overlap_off(model_path):
    """A slot that fills up shifts its context at the next scheduled step: the overlapped step before
    it never writes past the slot, and the answer is overlap off's."""
    reqs = [Request(p, GREEDY, n_predict=90) for p in prompts(2)]
    off, on = (drive(make_engine(model_path, m, n_parallel=2, ctx_size=2 * 48, context_shift=True), {0: reqs})
               for m in ("off", "on"))
    same_answers(off, on)
    assert all(len(t) == 90 and f.truncated for t, _, f, _ in on)


def test_a_layout_swap_lands_the_step_in_flight_first(model_path):
    """A lab layout swap queued mid-generation migrates the KV with no step in flight: the tokens
    are those of an unswapped run with overlap off."""
    req = Request(prompts(1)[0], GREEDY, n_predict=40, ignore_eos=True)
    want = drive(make_engine(model_path, "off"), {0: [req]})[0][0]
    engine = make_engine(model_path, "on")
    handle = engine.submit(req)
    for _ in range(6):
        engine.step()
    assert engine.overlap.in_flight is not None
    swap = engine.lab.switch_layout("head_seq_dim")
    deadline = time.monotonic() + 60
    while not engine.lab.has_pending() and not swap.done() and time.monotonic() < deadline:
        time.sleep(0.005)   # validated on the lab's thread, then queued for a step boundary
    while not swap.done():
        engine.step()
    assert engine.sched.running(), "the swap waited for the end of the generation"
    while engine.step():
        pass
    assert swap.result()["result"] == "swapped" and engine.cache.name == "head_seq_dim"
    assert handle.result(timeout=0).tokens == want and engine.overlap.launched > 20


def test_a_row_without_usable_logits_fails_only_its_request(model_path):
    """The device sampler flags a row whose logits are unusable (NaN/inf): that request gets an error
    when its step lands, its extra row is discarded, the others go on as with overlap off, and the
    engine serves the next request."""
    reqs = [Request(p, GREEDY, n_predict=12, ignore_eos=True) for p in prompts(3)]
    want = drive(make_engine(model_path, "off"), {0: reqs})
    engine = make_engine(model_path, "on")
    sample_ids, calls = engine.sampling.sample_ids, []

    def flag_row_zero(plan, logits):   # the 5th overlapped sampling: row 0's maximum "not finite"
        ids = sample_ids(plan, logits)
        calls.append(1)
        if len(calls) == 5:
            ids = SampledIds(torch.stack([ids.tokens, torch.tensor([0] + [1] * (len(plan.chunks) - 1))]))
        return ids

    engine.sampling.sample_ids = flag_row_zero
    handles = [engine.submit(r) for r in reqs]
    while engine.step():
        pass
    with pytest.raises(RuntimeError, match="NaN/inf"):
        handles[0].result(timeout=0)
    assert [h.result(timeout=0).tokens for h in handles[1:]] == [w[0] for w in want[1:]]
    assert engine.overlap.discarded == 1 and not engine.sched.has_work()
    assert drive(engine, {0: [reqs[0]]})[0][0] == want[0][0]


def test_probabilities_and_samplers_run_without_overlap(model_path):
    """n_probs needs the host's logits: those steps land before the next is scheduled; the answers
    (probabilities included) are those of overlap off."""
    seeded = SamplingParams(temperature=0.8, seed=11)
    reqs = [Request(prompts(2)[0], SamplingParams(temperature=0.0, n_probs=3), n_predict=8),
            Request(prompts(2)[1], seeded, n_predict=8)]
    off, on = (drive(make_engine(model_path, m), {0: reqs}) for m in ("off", "on"))
    same_answers(off, on)
    assert all(len(t) == 3 for t in on[0][3]) and on[0][3] != [()] * 8


def test_engine_thread_settles_and_stats_count_each_token(model_path):
    """On the engine's thread: every token arrives, /slots goes idle, the stats count each token once."""
    engine = make_engine(model_path, "on").start()
    try:
        hs = [engine.submit(Request(p, GREEDY, n_predict=15, ignore_eos=True)) for p in prompts(4)]
        assert [len(h.result(timeout=30).tokens) for h in hs] == [15] * 4
        assert engine.call(lambda: engine.overlap.in_flight is None).result(timeout=10)
        stats = engine.call(lambda: engine.tracker.snapshot).result(timeout=10)
    finally:
        engine.stop()
    assert stats.predicted_tokens == 60 and all(s.state == "idle" for s in stats.slots)
    assert engine.overlap.launched > 0


def test_mode_is_validated_and_auto_is_cuda_only():
    from slotserver.cli import main as cli
    from slotserver.server.config_from_args import plan_from_args

    parse = cli.build_parser().parse_args
    assert plan_from_args(parse(["serve", "--async-steps", "on"])).engine.async_steps == "on"
    assert plan_from_args(parse(["serve"])).engine.async_steps == "auto"
    with pytest.raises(SystemExit):
        parse(["serve", "--async-steps", "sometimes"])
    with pytest.raises(ConfigError, match="--async-steps"):
        EngineConfig(async_steps="yes")
    assert EngineConfig().overlaps("cuda") and not EngineConfig().overlaps("cpu")
    assert EngineConfig(async_steps="on").overlaps("cpu") and not EngineConfig(async_steps="off").overlaps("cuda")
