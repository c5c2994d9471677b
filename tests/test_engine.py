"""The slot engine on the real model (`serve`'s matmuls, the file's GGUF blocks, with float32
activations and K/V; greedy): continuous batching is invisible, the prompt cache is reused, stops
and limits behave like llama-server's.

Why the blocks and not the exact dequantized float32 weights (`--dtype float32`, the reference
mode, which test_model_reference.py holds to llama.cpp and test_batching.py to batch invariance):
what these tests assert is the engine's own bookkeeping against the plain generator on the same
model; the blocks are the path built to be batch-invariant (docs/architecture.md, "Batch
invariance"; torch's float32 GEMM is exact but blocks by row count); and they decode a row ~4.6x
faster on one core (0.26 vs 1.2 s for 12 tokens), which was most of this file's time in the suite."""

from __future__ import annotations

import random

import pytest

from slotserver.model.bundle import ModelBundle
from slotserver.model.config import ModelConfig
from slotserver.engine.engine import Engine
from slotserver.engine.config import EngineConfig
from slotserver.model.generate import GenRequest, generate
from slotserver.engine.request import EngineBusy, Request, RequestError, TokenEvent
from slotserver.model.sampling.sampler import SamplingParams

GREEDY = SamplingParams(temperature=0)
PROMPTS = [
    "The capital of France is",
    "Once upon a time, in a land far away,",
    "def add(a, b):",
    "The three primary colors are",
    "<|im_start|>user\nName a fruit.<|im_end|>\n<|im_start|>assistant\n",
    "Water boils at",
    "My favorite book is",
    "In 1969, the first man on the moon was",
]


@pytest.fixture(scope="module")
def bundle(smollm_path):
    return ModelBundle.load(ModelConfig(model_path=smollm_path, weights="q"))


@pytest.fixture(scope="module")
def prompts(bundle):
    return [tuple(bundle.tokenizer.encode(p, parse_special=True)) for p in PROMPTS]


@pytest.fixture(scope="module")
def alone(bundle, prompts):
    """Each prompt decoded alone with the plain generator: the oracle."""
    n = [6 + 3 * (i % 4) for i in range(len(prompts))]
    return n, [generate(bundle.model, [GenRequest(list(p), k, ignore_eos=True)], bundle.tokenizer.eog_ids)[0].tokens
               for p, k in zip(prompts, n)]


def run_sync(engine: Engine, arrivals: dict[int, list[Request]], max_steps: int = 2000) -> list:
    """Drive the engine step by step on this thread; submit requests at the given step numbers."""
    handles, step = [], 0
    while step < max_steps:
        for req in arrivals.get(step, []):
            handles.append(engine.submit(req))
        worked = engine.step()
        step += 1
        if not worked and step > max(arrivals):
            break
    return [h.result(timeout=0) for h in handles]


@pytest.mark.parametrize("defrag", ["on", "off"])
def test_continuous_batching_matches_each_prompt_alone(bundle, prompts, alone, defrag):
    n_predict, want = alone
    rng = random.Random(5)
    arrivals: dict[int, list[Request]] = {}
    for p, k in zip(prompts, n_predict):
        arrivals.setdefault(rng.randrange(0, 25), []).append(Request(p, GREEDY, n_predict=k, ignore_eos=True))
    order = [r for step in sorted(arrivals) for r in arrivals[step]]
    engine = Engine(bundle, EngineConfig(n_parallel=4, ctx_size=512, ubatch_size=16, defrag=defrag))
    results = run_sync(engine, arrivals)
    by_prompt = {p: w for p, w in zip(prompts, want)}
    for req, res in zip(order, results):
        assert res.tokens == by_prompt[req.prompt_ids], bundle.tokenizer.decode(req.prompt_ids)
    stats = engine.stats()
    if defrag == "on":
        assert stats.defrag_moves > 0 and stats.defrag_bytes > 0, "the scenario should move sequences"
    else:
        assert stats.defrag_moves == 0


def test_sequence_moved_mid_generation_keeps_its_output(bundle, prompts, alone):
    """A short request finishes first; the engine moves a generating sequence into its stream."""
    n_predict, want = alone
    engine = Engine(bundle, EngineConfig(n_parallel=4, ctx_size=512, defrag="on"))
    picks = (0, 3, 7, 2)
    handles = [engine.submit(Request(prompts[i], GREEDY, n_predict=n_predict[i], ignore_eos=True)) for i in picks]
    stream_of, moved_mid_generation = {}, False
    while engine.step():
        for seq in engine.sched.running():
            stream = engine.sched.streams.stream_of[seq.slot_id]
            if seq.num_generated > 1 and stream_of.get(seq.id, stream) != stream:
                moved_mid_generation = True
            stream_of[seq.id] = stream
    assert moved_mid_generation
    for i, h in zip(picks, handles):
        assert h.result(timeout=0).tokens == want[i]


def test_follow_up_request_prefills_only_new_tokens(bundle):
    tok = bundle.tokenizer
    base = tuple(tok.encode("Here is a long story about a dragon and a knight. " * 6))
    follow = base + tuple(tok.encode(" The dragon said"))
    engine = Engine(bundle, EngineConfig(n_parallel=2, ctx_size=1024))
    first = run_sync(engine, {0: [Request(base, GREEDY, n_predict=4)]})[0]
    assert first.final.n_cached == 0
    before = engine.stats().prompt_tokens
    warm = run_sync(engine, {0: [Request(follow, GREEDY, n_predict=8)]})[0]
    assert warm.final.n_cached == len(base)
    assert engine.stats().prompt_tokens - before == len(follow) - len(base)
    cold_engine = Engine(bundle, EngineConfig(n_parallel=2, ctx_size=1024))
    cold = run_sync(cold_engine, {0: [Request(follow, GREEDY, n_predict=8, cache_prompt=False)]})[0]
    assert cold.final.n_cached == 0 and cold.tokens == warm.tokens


def test_slot_selection_prefers_the_slot_holding_the_prefix(bundle, prompts):
    engine = Engine(bundle, EngineConfig(n_parallel=3, ctx_size=768))
    for i in range(3):
        run_sync(engine, {0: [Request(prompts[i], GREEDY, n_predict=2)]})
    holder = [s.id for s in engine.sched.slots.slots if s.cached[: len(prompts[1])] == list(prompts[1])]
    again = run_sync(engine, {0: [Request(prompts[1] + (13,), GREEDY, n_predict=2)]})[0]
    assert again.final.n_cached == len(prompts[1]) and [again.final.id_slot] == holder


def test_stop_string_across_tokens_and_limits(bundle, prompts):
    engine = Engine(bundle, EngineConfig(n_parallel=2, ctx_size=256))
    free = run_sync(engine, {0: [Request(prompts[0], GREEDY, n_predict=12, ignore_eos=True)]})[0]
    assert free.final.stop_type == "limit" and free.final.n_predicted == 12
    word = free.text[5:9]  # a stop string that spans token boundaries in the middle of the text
    hit = run_sync(engine, {0: [Request(prompts[0], GREEDY, n_predict=12, stop=(word,), ignore_eos=True)]})[0]
    assert hit.final.stop_type == "word" and hit.final.stopping_word == word
    assert hit.text == free.text[: free.text.find(word)]


def test_full_context_stops_with_truncated(bundle, prompts):
    engine = Engine(bundle, EngineConfig(n_parallel=1, ctx_size=16))
    res = run_sync(engine, {0: [Request(prompts[0], GREEDY, ignore_eos=True)]})[0]
    assert res.final.truncated and res.final.stop_type == "limit"
    assert len(prompts[0]) + len(res.tokens) == 16


def test_bad_requests_and_busy(bundle, prompts):
    engine = Engine(bundle, EngineConfig(n_parallel=1, ctx_size=16, queue_limit=1))
    with pytest.raises(RequestError, match="exceeds the available context"):
        engine.submit(Request(tuple(range(100, 120))))
    with pytest.raises(RequestError, match="empty"):
        engine.submit(Request(()))
    with pytest.raises(RequestError, match="id_slot"):
        engine.submit(Request(prompts[0], id_slot=3))
    engine.submit(Request(prompts[0], n_predict=2))
    engine.submit(Request(prompts[0], n_predict=2))
    with pytest.raises(EngineBusy):
        engine.submit(Request(prompts[0], n_predict=2))


def test_cancel_frees_the_slot_at_the_next_step(bundle, prompts):
    engine = Engine(bundle, EngineConfig(n_parallel=1, ctx_size=256))
    h = engine.submit(Request(prompts[0], GREEDY, n_predict=100))
    waiting = engine.submit(Request(prompts[1], GREEDY, n_predict=3))
    engine.step(), engine.step()
    h.cancel()
    engine.step()
    events = list(h.iter_events(timeout=0))
    assert events[-1].stop_type == "none"
    assert engine.stats().slots[0].id_task == waiting.id  # the queued request got the slot
    while engine.step():
        pass
    assert waiting.result(timeout=0).final.stop_type == "limit"


def test_engine_thread_streams_events(bundle, prompts):
    engine = Engine(bundle, EngineConfig(n_parallel=2, ctx_size=256)).start()
    try:
        events = list(engine.submit(Request(prompts[0], GREEDY, n_predict=5)).iter_events(timeout=60))
    finally:
        engine.stop()
    assert sum(isinstance(e, TokenEvent) for e in events) == 5
    assert engine.stats().requests_done == 1


def test_stats_show_the_slot_busy_when_its_first_token_is_emitted(bundle, prompts):
    """A client that has its first token and asks /slots sees its slot processing (the snapshot
    is published when a request is admitted, not only at the end of the step)."""
    engine = Engine(bundle, EngineConfig(n_parallel=2, ctx_size=256))
    h = engine.submit(Request(prompts[0], GREEDY, n_predict=3))
    seen = []
    emit = h.emit

    def spy(event):
        if isinstance(event, TokenEvent) and not seen:
            seen.append([s.state for s in engine.stats().slots])
        emit(event)

    h.emit = spy
    engine.step()
    assert seen == [["processing", "idle"]]


def test_a_steps_events_wake_the_event_loop_once_and_arrive_in_order(bundle, prompts):
    """Three streaming requests: every step hands all its token events to the asyncio loop in one
    `call_soon_threadsafe` (not one per event), and each client still gets its own events in order."""
    import asyncio

    loop = asyncio.new_event_loop()
    wakeups = []
    schedule = loop.call_soon_threadsafe
    loop.call_soon_threadsafe = lambda *a: wakeups.append(a) or schedule(*a)
    engine = Engine(bundle, EngineConfig(n_parallel=4, ctx_size=4 * 128))
    handles = [engine.submit(Request(p, GREEDY, n_predict=5, ignore_eos=True), loop=loop) for p in prompts[:3]]
    steps = 0
    while engine.step():
        steps += 1
    assert 0 < len(wakeups) <= steps

    async def collect_all():
        return [[e async for e in h.events()] for h in handles]

    events = loop.run_until_complete(collect_all())
    loop.close()
    sync = Engine(bundle, EngineConfig(n_parallel=4, ctx_size=4 * 128))
    plain = [sync.submit(Request(h.request.prompt_ids, GREEDY, n_predict=5, ignore_eos=True)) for h in handles]
    while sync.step():
        pass
    for h, evs in zip(plain, events):
        tokens = [e.token for e in evs if isinstance(e, TokenEvent)]
        assert type(evs[-1]).__name__ == "FinalEvent"
        assert tokens == list(h.result(timeout=0).tokens) and len(tokens) == 5
