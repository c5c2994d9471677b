"""Overlapped decode steps (--async-steps, engine/overlap.py) on the CPU, forced on: what a client
sees is what it sees with overlap off, token for token, through stops, limits, cancels, n_probs and
the slot caches. The logic is device-agnostic; on the CPU the forward blocks, so only the order of
the host's work changes. tests/test_device.py runs the engine on CUDA with the default (auto: on)."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from tiny_gguf import write_tiny_gguf

from slotserver.engine.config import EngineConfig
from slotserver.engine.engine import Engine
from slotserver.engine.request import FinalEvent, Request, TokenEvent
from slotserver.errors import ConfigError
from slotserver.model.bundle import ModelBundle
from slotserver.model.config import ModelConfig
from slotserver.model.sampling.params import SamplingParams

GREEDY = SamplingParams(temperature=0.0)


@pytest.fixture(autouse=True)
def one_torch_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    return write_tiny_gguf(tmp_path_factory.mktemp("async") / "tiny.gguf", n_layers=2, d_model=32, n_heads=4,
                           n_kv_heads=2, d_ff=64, ctx_len=512, seed=3)


def make_engine(path, mode: str, layout: str = "seq_head_dim", eog: frozenset[int] | None = None, **config) -> Engine:
    bundle = ModelBundle.load(ModelConfig(model_path=path, layout=layout, threads=1))
    engine = Engine(bundle, EngineConfig(async_steps=mode, **({"n_parallel": 3, "ctx_size": 3 * 64} | config)))
    if eog is not None:   # a token the random model does generate acts as end of generation
        engine.eog = eog
    return engine


def drive(engine: Engine, script: dict[int, list], max_steps: int = 400) -> list:
    """Step the engine on this thread; script[step]: Requests to submit, or ("cancel", i) for the i-th
    submitted. -> each request's (tokens, texts, final event), in submission order."""
    handles, step = [], 0
    while step < max_steps:
        for item in script.get(step, []):
            if isinstance(item, Request):
                handles.append(engine.submit(item))
            else:
                engine.cancel(handles[item[1]].id)
        if not engine.step() and step > max(script):
            break
        step += 1
    return [_events(h) for h in handles]


def _events(handle) -> tuple[list[int], str, FinalEvent, list]:
    tokens, text, tops, final = [], "", [], None
    for ev in handle.iter_events(timeout=0):
        if isinstance(ev, TokenEvent):
            tokens.append(ev.token)
            tops.append(ev.top)
            text += ev.text
        elif isinstance(ev, FinalEvent):
            final, text = ev, text + ev.text
    return tokens, text, final, tops


def prompts(n: int) -> list[tuple[int, ...]]:
    return [tuple(3 + (7 * i + j) % 200 for j in range(4 + 3 * i)) for i in range(n)]


def same_answers(a, b) -> None:
    for (ta, xa, fa, pa), (tb, xb, fb, pb) in zip(a, b, strict=True):
        assert (ta, xa, pa) == (tb, xb, pb)
        assert (fa.stop_type, fa.stopping_word, fa.n_predicted, fa.n_prompt, fa.truncated) == \
            (fb.stop_type, fb.stopping_word, fb.n_predicted, fb.n_prompt, fb.truncated)


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


def test_context_shift_matches_overlap_off(model_path):
    """A slot that fills up shifts its context at the next scheduled step: the overlapped step before
    it never writes past the slot, and the answer is overlap off's."""
    reqs = [Request(p, GREEDY, n_predict=90) for p in prompts(2)]
    off, on = (drive(make_engine(model_path, m, n_parallel=2, ctx_size=2 * 48, context_shift=True), {0: reqs})
               for m in ("off", "on"))
    same_answers(off, on)
    assert all(len(t) == 90 and f.truncated for t, _, f, _ in on)


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
    with pytest.raises(ConfigError, match="--async-steps"):
        EngineConfig(async_steps="yes")
    assert EngineConfig().overlaps("cuda") and not EngineConfig().overlaps("cpu")
    assert EngineConfig(async_steps="on").overlaps("cpu") and not EngineConfig(async_steps="off").overlaps("cuda")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_overlap_gives_the_tokens_of_overlap_off(model_path):
    """On the GPU (auto: on), steps launched ahead of their input ids: the same tokens as overlap off
    where both compute the same batches (stops known in advance; one request for the end of
    generation, whose extra row has no neighbour), and the stopped request caches no extra token."""
    bundle = ModelBundle.load(ModelConfig(model_path, device="cuda"))
    ps = prompts(5)
    script = {0: [Request(ps[0], GREEDY, n_predict=20, ignore_eos=True), Request(ps[1], GREEDY, n_predict=7)],
              3: [Request(ps[2], GREEDY, n_predict=11)], 6: [Request(ps[3], GREEDY, n_predict=30)]}
    script = {k: [replace(r, ignore_eos=True) for r in v] for k, v in script.items()}   # every stop a limit
    runs, engines = [], []
    for mode in ("off", "auto"):
        engines.append(Engine(bundle, EngineConfig(n_parallel=4, ctx_size=256, async_steps=mode)))
        runs.append(drive(engines[-1], script))
    assert engines[1].overlap.enabled and engines[1].overlap.launched > 10
    same_answers(*runs)
    tokens = runs[0][2][0]
    k = next(i for i in range(2, len(tokens)) if tokens[i] not in tokens[:i])   # a first occurrence
    one = Engine(bundle, EngineConfig(n_parallel=1, ctx_size=64))
    one.eog = frozenset({tokens[k]})
    got, _, final, _ = drive(one, {0: [Request(ps[2], GREEDY, n_predict=20)]})[0]
    assert final.stop_type == "eos" and got == tokens[: k + 1] and one.overlap.discarded == 1
    assert one.sched.slots.slots[0].cached == list(ps[2]) + got[:-1]
