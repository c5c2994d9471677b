"""Speculative decoding (issue 37): drafts from n-grams or a draft model, verified in one batched
forward. What a user sees: the same tokens as without speculation (greedy, and sampled with a
seed), fewer steps, and the acceptance counts in timings and /metrics."""

from __future__ import annotations

import pytest

from slotserver.engine.config import EngineConfig
from slotserver.engine.engine import Engine
from slotserver.engine.request import Request
from slotserver.engine.speculative.config import SpecConfig
from slotserver.engine.speculative.draft_model import VocabularyMismatch, check_vocabulary
from slotserver.engine.speculative.ngram_mod import NgramMod
from slotserver.engine.speculative.ngram_simple import NgramSimple
from slotserver.engine.speculative.speculator import SpecState
from slotserver.errors import ConfigError
from slotserver.model.bundle import ModelBundle
from slotserver.model.config import ModelConfig
from slotserver.model.sampling.params import SamplingParams
from tiny_gguf import write_tiny_gguf

PROMPT = tuple([5, 6, 7, 8, 9, 10, 11, 12] * 6)
NGRAM = SpecConfig(types=("ngram-mod",), ngram_mod_n_match=2, ngram_mod_n_min=1, ngram_mod_n_max=8)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = write_tiny_gguf(tmp_path_factory.mktemp("spec") / "t.gguf", ctx_len=512)
    return ModelBundle.load(ModelConfig(path, threads=1))


def _generate(bundle, spec: SpecConfig, temperature: float = 0.0, n: int = 60, prompt=PROMPT, ctx: int = 512,
              steps: list | None = None, engines: list | None = None, **fields):
    engine = Engine(bundle, EngineConfig(n_parallel=2, ctx_size=ctx, spec=spec),
                    draft=bundle if "draft-simple" in spec.types else None)
    if engines is not None:
        engines.append(engine)
    req = Request(prompt, SamplingParams(temperature=temperature, seed=3, top_k=3), n_predict=n, ignore_eos=True,
                  **fields)
    handle = engine.submit(req)
    count = 0
    while engine.step():
        count += 1
    if steps is not None:
        steps.append(count)
    return handle.result(1)


# -- drafters ---------------------------------------------------------------------------------------
def test_ngram_simple_copies_what_followed_the_latest_earlier_match():
    d = NgramSimple(size_n=2, size_m=3)
    history = [0, 1, 2, 3, 4, 5, 9, 9, 9, 1, 2]     # the last 2 tokens (1, 2) appeared earlier (at 1)
    assert d.propose_one(history, 8) == [3, 4, 5]
    assert d.propose_one(history, 2) == [3, 4]          # the caller's cap
    assert d.propose_one([1, 2, 3, 4, 5, 6, 7, 8], 8) == []   # no earlier match
    assert d.propose_one([1, 2, 3, 4, 5, 9, 9, 9, 1, 2], 8) == []   # llama.cpp: a match at 0 is none


def test_ngram_mod_chains_hashed_ngrams_and_drops_short_chains():
    d = NgramMod(n_match=2, n_min=3, n_max=4, size=1 << 16)
    history = [1, 2, 3, 4, 5, 6, 7, 1, 2]
    assert d.propose_one(history, 8, seq_id=1) == [3, 4, 5, 6]   # n_max
    history = [1, 2, 3, 5, 6, 1, 2]                   # (1 2)->3 (2 3)->5 (3 5)->6 (5 6)->1, then (6 1) unseen
    assert NgramMod(n_match=2, n_min=4, n_max=8).propose_one(history, 8) == [3, 5, 6, 1]
    assert NgramMod(n_match=2, n_min=5, n_max=8).propose_one(history, 8) == []   # a chain under n_min


def test_ngram_mod_resets_after_five_mostly_rejected_drafts():
    d = NgramMod(n_match=2, n_min=1, n_max=4, size=1 << 16)
    history = [1, 2, 3, 4, 5, 6, 7, 1, 2]
    for _ in range(5):
        assert d.propose_one(history, 8, seq_id=1)
        d.accepted(1, 4, 0)
    assert not d.table


def test_adaptive_cap_grows_on_full_accepts_and_backs_off_on_misses():
    s = SpecState(cap=4)
    s.learn(4, 4, n_max=16, adaptive=True)
    assert s.cap == 8 and s.skip == 0
    s.learn(8, 1, n_max=16, adaptive=True)
    assert s.cap == 3
    s.learn(3, 0, n_max=16, adaptive=True)
    s.learn(1, 0, n_max=16, adaptive=True)
    assert (s.cap, s.skip) == (1, 2) and (s.drafted, s.accepted, s.drafts) == (16, 5, 4)


# -- the engine: same tokens, fewer steps ---------------------------------------------------------
@pytest.mark.parametrize("temperature", [0.0, 0.5, 1.5])
@pytest.mark.parametrize("spec", [NGRAM, "draft"], ids=["ngram-mod", "draft-simple"])
def test_speculation_gives_the_tokens_of_plain_decoding(tiny, spec, temperature):
    if spec == "draft":   # the tiny model as its own draft
        spec = SpecConfig(types=("draft-simple",), draft_model=tiny.config.model_path, draft_n_max=6)
    plain_steps, spec_steps = [], []
    plain = _generate(tiny, SpecConfig(), temperature, steps=plain_steps)
    fast = _generate(tiny, spec, temperature, steps=spec_steps)
    assert fast.tokens == plain.tokens and fast.text == plain.text
    assert fast.final.draft_n > 0 and 0 <= fast.final.draft_n_accepted <= fast.final.draft_n
    assert spec_steps[0] < plain_steps[0] - fast.final.draft_n_accepted // 2   # accepted drafts save steps


def test_a_model_drafting_for_itself_greedily_is_always_accepted(tiny):
    """Batch invariance: a verify row computes what a decode step computes, so a greedy self-draft
    never misses."""
    spec = SpecConfig(types=("draft-simple",), draft_model=tiny.config.model_path, draft_n_max=5)
    out = _generate(tiny, spec, prompt=tuple(range(5, 40)))
    assert out.final.draft_n >= 40 and out.final.draft_n_accepted == out.final.draft_n


def test_a_paged_pool_holds_only_the_accepted_tokens(tmp_path):
    """Rejected drafts' blocks go back to the pool after every step: it holds what the scheduler
    counts (the sequence's tokens), so admission never promises blocks a draft took."""
    paged = ModelBundle.load(ModelConfig(write_tiny_gguf(tmp_path / "p.gguf", ctx_len=512), threads=1, layout="paged"))
    engine = Engine(paged, EngineConfig(n_parallel=2, ctx_size=512, spec=NGRAM))
    handle = engine.submit(Request(PROMPT, SamplingParams(temperature=1.5, seed=3, top_k=3), n_predict=60,
                                   ignore_eos=True))
    layout, held = engine.cache.layout, []
    while engine.step():
        held.append((layout.blocks.alloc.n_used, -(-handle.seq.num_tokens // layout.block_size)))
    out = handle.result(1)
    assert out.tokens == _generate(paged, SpecConfig(), temperature=1.5).tokens
    assert 0 < out.final.draft_n_accepted < out.final.draft_n     # some drafts were rejected
    assert all(used <= want for used, want in held), held


def test_drafts_stop_at_a_full_slot_and_at_n_predict(tiny):
    full = _generate(tiny, NGRAM, n=-1, ctx=256)     # 128 cells a slot
    assert full.final.truncated and len(PROMPT) + len(full.tokens) == 128
    assert full.tokens == _generate(tiny, SpecConfig(), n=-1, ctx=256).tokens
    assert len(_generate(tiny, NGRAM, n=7).tokens) == 7


def test_speculative_n_max_zero_turns_it_off_for_one_request(tiny):
    out = _generate(tiny, NGRAM, spec_n_max=0)
    assert out.final.draft_n == 0


def test_a_draft_model_of_another_vocabulary_is_refused(tiny, tmp_path):
    other = ModelBundle.load(ModelConfig(write_tiny_gguf(tmp_path / "o.gguf", vocab_extra_merges=("a b",)), threads=1))
    with pytest.raises(VocabularyMismatch, match="vocabulary"):
        check_vocabulary(tiny, other)
    check_vocabulary(tiny, tiny)


def test_bad_spec_flags_are_config_errors(tmp_path):
    with pytest.raises(ConfigError, match="draft model"):
        SpecConfig(types=("draft-simple",))
    with pytest.raises(ConfigError, match="unknown type"):
        SpecConfig(types=("eagle",))
    with pytest.raises(ConfigError, match="n-min"):
        SpecConfig(types=("ngram-mod",), ngram_mod_n_min=9, ngram_mod_n_max=8)


# -- through HTTP: llama-server's timings, /metrics and request fields ------------------------------
@pytest.fixture(scope="module")
def client(tiny):
    from test_server_api import make_client

    engine = Engine(tiny, EngineConfig(n_parallel=2, ctx_size=512, spec=NGRAM)).start()
    try:
        with make_client((tiny, engine), metrics=True) as c:
            yield c
    finally:
        engine.stop()


def _complete(client, **fields):
    body = {"prompt": list(PROMPT), "n_predict": 40, "temperature": 0, "ignore_eos": True, **fields}
    r = client.post("/completion", json=body)
    assert r.status_code == 200, r.text
    return r.json()


def _metric(text: str, name: str) -> float:
    return float(next(line.split()[-1] for line in text.splitlines() if line.startswith(f"llamacpp:{name} ")))


def test_timings_and_metrics_count_drafts_and_accepted_tokens(client):
    before = client.get("/metrics").text
    t = _complete(client)["timings"]
    assert t["draft_n"] > 0 and 0 < t["draft_n_accepted"] <= t["draft_n"]
    after = client.get("/metrics").text
    for name, value in (("spec_decode_num_draft_tokens_total", t["draft_n"]),
                        ("spec_decode_num_accepted_tokens_total", t["draft_n_accepted"])):
        assert _metric(after, name) - _metric(before, name) == value
    assert _metric(after, "spec_decode_num_drafts_total") > _metric(before, "spec_decode_num_drafts_total")
    assert client.get("/slots").json()[0]["speculative"] is True


def test_request_fields_size_or_refuse_speculation(client):
    off = _complete(client, **{"speculative.n_max": 0})["timings"]
    assert "draft_n" not in off     # as llama-server: only present once something was drafted
    assert _complete(client, **{"speculative.type": "none"})["content"] == _complete(client)["content"]
    for body, word in (({"speculative.type": "eagle3"}, "speculative.type"),
                       ({"speculative.n_min": 5, "speculative.n_max": 2}, "speculative.n_min"),
                       ({"speculative.p_min": 2}, "speculative.p_min")):
        r = client.post("/completion", json={"prompt": "hi", "n_predict": 2, **body})
        assert r.status_code == 400 and word in r.json()["error"]["message"]


def test_the_default_model_drafting_for_itself_is_always_accepted(smollm_path):
    """The real model's kernels (Q4_1 weights, f16 KV: the CLI's --dtype auto) are batch-invariant:
    the verify forward's rows equal decode steps, so a greedy self-draft is never rejected and the
    text is the one decoding alone gives."""
    bundle = ModelBundle.load(ModelConfig(smollm_path, dtype="auto"))
    ids = tuple(bundle.tokenizer.encode("<|im_start|>user\nWrite a poem about the sea.<|im_end|>\n"
                                        "<|im_start|>assistant\n"))
    spec = SpecConfig(types=("draft-simple",), draft_model=smollm_path, draft_n_max=4)
    plain, fast = (_generate(bundle, s, n=24, prompt=ids, ctx=1024) for s in (SpecConfig(), spec))
    assert fast.tokens == plain.tokens
    assert fast.final.draft_n >= 16 and fast.final.draft_n_accepted == fast.final.draft_n


def test_synthetic_acceptance_keeps_drafts_at_the_given_rates(tiny):
    """--spec-synth-rates (llama.cpp's benchmarking mode): rate 1 keeps every draft, rate 0 none (and
    then the output is plain decoding's); a seed makes the draws repeat."""
    base = dict(types=("ngram-mod",), ngram_mod_n_match=2, ngram_mod_n_min=1, ngram_mod_n_max=4)
    every = _generate(tiny, SpecConfig(**base, synth_rates=(1.0,) * 4), temperature=0.8)
    assert every.final.draft_n > 0 and every.final.draft_n_accepted == every.final.draft_n
    none = _generate(tiny, SpecConfig(**base, synth_rates=(0.0,) * 4), temperature=0.8)
    assert none.final.draft_n > 0 and none.final.draft_n_accepted == 0
    assert none.tokens == _generate(tiny, SpecConfig(), temperature=0.8).tokens
    half = [_generate(tiny, SpecConfig(**base, synth_len=2.0), temperature=0.8).final for _ in range(2)]
    assert (half[0].draft_n, half[0].draft_n_accepted) == (half[1].draft_n, half[1].draft_n_accepted)
    assert 0 < half[0].draft_n_accepted < half[0].draft_n
    with pytest.raises(ConfigError, match="4 values"):
        SpecConfig(**base, synth_rates=(1.0, 0.5))


def test_a_draft_run_stops_where_it_arms_a_reasoning_budget(tokenizer):
    """The budget must see each token before the next is sampled: a verified run whose first token
    is the start tag keeps only that token (the drafts after it were sampled unbudgeted), and counts
    only its K/V; the next step samples under the budget."""
    from slotserver.engine.postprocess import Sampled, postprocess
    from slotserver.engine.reasoning_budget import BudgetSpec, ReasoningBudget
    from slotserver.engine.request import RequestHandle
    from slotserver.engine.scheduler import Scheduler
    from slotserver.engine.sequence import Sequence
    from slotserver.engine.stop_strings import StopMatcher
    from slotserver.model.sampling.sampler import SequenceRng
    from slotserver.model.text.detokenizer import IncrementalDetokenizer
    from dataclasses import replace

    sched = Scheduler(EngineConfig(n_parallel=1, ctx_size=64))
    req = Request((1, 2, 3), SamplingParams(temperature=0))
    seq = Sequence(RequestHandle(1, req, engine=None), [1, 2, 3], 3, SequenceRng(0), req.params,
                   IncrementalDetokenizer(tokenizer), StopMatcher(()))
    seq.reasoning = ReasoningBudget(BudgetSpec(2, ((60,),), ((61,),), (61,)))
    sched.add(seq)
    postprocess(sched, sched.schedule(), [(Sampled(7),)], tokenizer.eog_ids)     # prefill: 1 2 3 -> 7
    plan = sched.schedule()
    plan.chunks[0] = replace(plan.chunks[0], draft=(60, 8))                       # 7 | drafts 60 8
    postprocess(sched, plan, [(Sampled(60), Sampled(8), Sampled(9))], tokenizer.eog_ids)
    assert seq.tokens == [1, 2, 3, 7, 60] and seq.num_computed == 4 and not seq.reasoning.done


def test_a_reasoning_budget_sees_every_token_under_speculation(tiny):
    """The greedy output repeats token 66; as a start tag it arms a budget of 3 that forces (70, 71).
    Drafts stop where a run arms the budget, so the forced end comes where it comes without them."""
    from slotserver.engine.reasoning_budget import BudgetSpec

    budget = BudgetSpec(3, ((66,),), ((71,),), (70, 71))
    plain, fast = (_generate(tiny, s, n=40, reasoning_budget=budget) for s in (SpecConfig(), NGRAM))
    assert fast.tokens == plain.tokens and fast.final.draft_n_accepted > 0
    assert plain.tokens[:6] == [66, 66, 66, 66, 70, 71]


def test_speculation_under_context_shift_gives_the_tokens_of_plain_decoding(tiny):
    """A generation past the slot's end (context shift on): drafts stop short of the full slot, the
    shift runs, drafting resumes on the shifted tokens; the text is plain decoding's."""
    def run(spec):
        engine = Engine(tiny, EngineConfig(n_parallel=2, ctx_size=256, spec=spec, context_shift=True))
        handle = engine.submit(Request(PROMPT, SamplingParams(temperature=0), n_predict=200, ignore_eos=True))
        while engine.step():
            pass
        return handle.result(1)
    plain, fast = run(SpecConfig()), run(NGRAM)
    assert len(fast.tokens) == 200 and fast.final.truncated
    assert fast.tokens == plain.tokens and fast.final.draft_n_accepted > 0
