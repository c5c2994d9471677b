"""Sampler behaviour a client relies on: llama.cpp's chain semantics, reproducibility, batching."""

from __future__ import annotations

import copy
import math
import random

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from slotserver.model.sampling.sampler import (
    Sampler,
    SamplingError,
    SamplingParams,
    SequenceRng,
    apply_penalties,
)

# A hand-made distribution, sorted so that token id == rank.
PROBS = torch.tensor([0.40, 0.25, 0.15, 0.10, 0.05, 0.03, 0.015, 0.005])
LOGITS = PROBS.log() + 3.0  # any shift gives the same softmax


def draw_many(logits: torch.Tensor, params: SamplingParams, n: int = 4000) -> torch.Tensor:
    """n independent draws from one row: a batch of n copies, each with its own seeded RNG."""
    batch = logits[None, :].expand(n, -1)  # [n, vocab]
    rngs = [SequenceRng(seed) for seed in range(n)]
    return Sampler(logits.shape[0]).sample(batch, [params] * n, rngs, [[]] * n).tokens


def expected(kept: list[int], temperature: float = 1.0) -> torch.Tensor:
    """The renormalised distribution over `kept` tokens of PROBS at `temperature`."""
    out = torch.zeros_like(PROBS)
    out[kept] = PROBS[kept] ** (1.0 / temperature)
    return out / out.sum()


@pytest.mark.parametrize("vocab", [3000, 4096])  # plain and blocked argmax
@pytest.mark.parametrize("temperature", [0.0, -1.0])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_greedy_is_argmax_for_any_dtype(vocab, temperature, dtype):
    logits = torch.randn(16, vocab, generator=torch.Generator().manual_seed(1)).to(dtype)
    logits[0, [2100, 70, 2900]] = 100.0  # ties go to the lowest id, as in llama.cpp
    params = [SamplingParams(temperature=temperature, top_k=k) for k in range(16)]
    out = Sampler(vocab).sample(logits, params, [SequenceRng(0) for _ in range(16)], [[]] * 16)
    assert torch.equal(out.tokens, logits.float().argmax(dim=1)) and int(out.tokens[0]) == 70
    assert out.tokens.dtype == torch.int64 and out.logprobs is None and out.top_ids is None


def test_top_k_one_is_greedy_even_when_hot():
    logits = torch.randn(32, 5000, generator=torch.Generator().manual_seed(2)) * 5
    params = [SamplingParams(temperature=3.0, top_k=1, top_p=1.0, min_p=0.0)] * 32
    out = Sampler(5000).sample(logits, params, [SequenceRng(i) for i in range(32)], [[]] * 32)
    assert torch.equal(out.tokens, logits.argmax(dim=1))


def test_logit_bias_forbids_and_forces_tokens():
    free = dict(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0)
    forbidden = draw_many(LOGITS, SamplingParams(**free, logit_bias=((0, -math.inf), (2, -math.inf))))
    assert not ({0, 2} & set(forbidden.tolist()))
    assert set(forbidden.tolist()) >= {1, 3}
    forced = draw_many(LOGITS, SamplingParams(**free, logit_bias=((7, 100.0),)), n=500)
    assert set(forced.tolist()) == {7}
    greedy = SamplingParams(temperature=0, logit_bias={0: -math.inf})  # mappings are accepted too
    assert draw_many(LOGITS, greedy, n=1).tolist() == [1]


@pytest.mark.parametrize(
    ("settings_", "kept"),
    [
        (dict(top_k=3, top_p=1.0, min_p=0.0), [0, 1, 2]),
        (dict(top_k=0, top_p=0.75, min_p=0.0), [0, 1, 2]),  # cumulative 0.40, 0.65, 0.80 >= 0.75
        (dict(top_k=100, top_p=0.75, min_p=0.0), [0, 1, 2]),  # top_k beyond the vocab is off
        (dict(top_k=0, top_p=1.0, min_p=0.2), [0, 1, 2, 3]),  # p >= 0.2 * 0.40
        (dict(top_k=3, top_p=0.7, min_p=0.0), [0, 1]),  # top_p renormalises over top_k's survivors
        (dict(top_k=0, top_p=0.9, min_p=0.3), [0, 1, 2]),  # min_p is the tighter bound
        (dict(top_k=0, top_p=1.0, min_p=0.0), list(range(8))),  # nothing truncated
    ],
)
@pytest.mark.parametrize("temperature", [1.0, 2.0])
def test_truncation_keeps_exactly_the_expected_tokens(settings_, kept, temperature):
    tokens = draw_many(LOGITS, SamplingParams(temperature=temperature, **settings_))
    freq = torch.bincount(tokens, minlength=8).float() / tokens.numel()
    assert set(tokens.tolist()) == set(kept)
    assert torch.allclose(freq, expected(kept, temperature), atol=0.025)


def test_wide_nucleus_beyond_the_initial_candidate_width():
    """top_p alone on a nearly flat distribution keeps thousands of tokens, exactly as many as it should."""
    vocab = 2000
    logits = -torch.arange(vocab, dtype=torch.float32) * 1e-3  # token id == rank
    cumulative = torch.cumsum(torch.softmax(logits, dim=0), dim=0)
    n_kept = int((cumulative < 0.9).sum()) + 1
    tokens = draw_many(logits, SamplingParams(temperature=1.0, top_k=0, top_p=0.9, min_p=0.0), n=1000)
    assert int(tokens.max()) < n_kept
    assert int(tokens.max()) > n_kept - 50  # the far end of the nucleus is reachable


def test_penalties_follow_the_llama_cpp_formula():
    logits = torch.tensor([[2.0, -1.0, 0.5, -3.0, 1.5, 0.0]])
    params = SamplingParams(repeat_penalty=1.5, presence_penalty=0.25, frequency_penalty=0.1, repeat_last_n=-1)
    history = [[0, 0, 1, 3, 3, 3, 5]]
    out = apply_penalties(logits, [params], history)[0]
    counts = {0: 2, 1: 1, 3: 3, 5: 1}
    want = logits[0].clone()
    for token, count in counts.items():
        value = float(want[token])
        value = value / 1.5 if value > 0 else value * 1.5
        want[token] = value - (count * 0.1 + 0.25)
    assert torch.allclose(out, want)
    assert torch.equal(logits, torch.tensor([[2.0, -1.0, 0.5, -3.0, 1.5, 0.0]]))  # input untouched


@pytest.mark.parametrize(("last_n", "penalised"), [(3, {2, 3, 4}), (-1, {0, 1, 2, 3, 4}), (0, set())])
def test_penalty_window_is_repeat_last_n(last_n, penalised):
    logits = torch.ones(2, 6)
    params = [SamplingParams(presence_penalty=1.0, repeat_last_n=last_n), SamplingParams(presence_penalty=1.0)]
    history = [[0, 1, 2, 3, 4], []]
    out = apply_penalties(logits, params, history)
    assert {i for i in range(6) if out[0, i] < 1} == penalised
    assert torch.equal(out[1], torch.ones(6))  # a row with no history is untouched


def test_penalties_steer_sampling():
    params = SamplingParams(temperature=0, repeat_penalty=1e6)  # argmax token 0 is in the history
    out = Sampler(8).sample(LOGITS[None], [params], [SequenceRng(0)], [[0, 5]])
    assert out.tokens.tolist() == [1]


def run_steps(seed: int, steps: int = 50) -> list[int]:
    logits = torch.zeros(1, 100)  # flat: every draw is decided by the RNG
    rng, sampler = SequenceRng(seed), Sampler(100)
    params = [SamplingParams(temperature=1.0, top_k=0, top_p=0.95, min_p=0.0)]
    return [int(sampler.sample(logits, params, [rng], [[]]).tokens) for _ in range(steps)]


def test_same_seed_same_tokens_different_seed_different_tokens():
    assert run_steps(1234) == run_steps(1234)
    assert run_steps(1234) != run_steps(1235)
    random_rng = SequenceRng(-1)
    assert 0 <= random_rng.seed < 2**32
    replay = SequenceRng(random_rng.seed)
    assert [replay.next_uniform() for _ in range(3)] == [random_rng.next_uniform() for _ in range(3)]


def test_mixed_batch_rows_match_rows_sampled_alone():
    vocab, gen = 16384, torch.Generator().manual_seed(3)  # batch uses torch.topk, rows alone the blocked path
    params = [
        SamplingParams(),
        SamplingParams(temperature=0),
        SamplingParams(temperature=1.3, top_k=5, top_p=1.0, min_p=0.0),
        SamplingParams(top_k=0, top_p=0.9, min_p=0.0),
        SamplingParams(top_k=0, top_p=1.0, min_p=0.0, temperature=0.7),
        SamplingParams(top_k=200, min_p=0.2, repeat_penalty=1.3, frequency_penalty=0.5, repeat_last_n=4),
        SamplingParams(temperature=0, presence_penalty=2.0, logit_bias=((7, 3.0), (9, -math.inf))),
        SamplingParams(top_k=0, top_p=1.0, min_p=0.1, n_probs=3),
    ]
    history = [[int(t) for t in torch.randint(0, vocab, (30,), generator=gen)] for _ in params]
    sampler = Sampler(vocab)
    batch_rngs = [SequenceRng(100 + i) for i in range(len(params))]
    alone_rngs = copy.deepcopy(batch_rngs)
    for _ in range(5):
        logits = torch.randn(len(params), vocab, generator=gen) * 4  # [batch, vocab]
        together = sampler.sample(logits, params, batch_rngs, history).tokens
        for i, p in enumerate(params):
            alone = sampler.sample(logits[i : i + 1], [p], [alone_rngs[i]], [history[i]]).tokens
            assert int(alone) == int(together[i]), f"row {i} ({p})"
            history[i].append(int(alone))


def reference_token(logits: np.ndarray, p: SamplingParams, u: float, history: list[int]) -> int:
    """A plain per-row float64 port of llama.cpp's chain, drawing with the uniform `u`."""
    x = logits.astype(np.float64)
    for token, bias in p.logit_bias:
        x[token] += bias
    window = history if p.repeat_last_n == -1 else history[-p.repeat_last_n :] if p.repeat_last_n else []
    for token in set(window) if p.penalties_active else ():
        x[token] = x[token] / p.repeat_penalty if x[token] > 0 else x[token] * p.repeat_penalty
        x[token] -= window.count(token) * p.frequency_penalty + p.presence_penalty
    if p.greedy:
        return int(np.argmax(x))
    order = np.argsort(-x, kind="stable")
    if (p.top_k <= 0 or p.top_k >= len(x)) and p.top_p >= 1 and p.min_p <= 0:
        order = np.arange(len(x))  # untruncated rows draw in vocabulary order
    order = order[: p.top_k] if p.top_k > 0 else order
    if p.top_p < 1:
        cum = np.cumsum(np.exp(x[order] - x[order].max()) / np.exp(x[order] - x[order].max()).sum())
        order = order[: int(np.argmax(cum >= p.top_p)) + 1 if cum[-1] >= p.top_p else len(order)]
    if p.min_p > 0:
        order = order[x[order] >= x[order].max() + math.log(p.min_p)]
    cdf = np.cumsum(np.exp((x[order] - x[order].max()) / p.temperature))
    return int(order[np.searchsorted(cdf, u * cdf[-1], side="right")])


@pytest.mark.parametrize("vocab", [16384, 3000])  # blocked top-k path and plain torch.topk path
def test_matches_a_per_row_reference_port_of_llama_cpp(vocab):
    rnd = random.Random(vocab)
    for trial in range(3):
        params = [
            SamplingParams(
                temperature=rnd.choice([0, 0.3, 1.0, 1.5]), top_k=rnd.choice([0, 1, 5, 40, 100, 10**6]),
                top_p=rnd.choice([1.0, 0.95, 0.5, 0.0]), min_p=rnd.choice([0, 0.05, 0.2, 1.0]),
                repeat_penalty=rnd.choice([1.0, 1.3]), repeat_last_n=rnd.choice([0, 8, -1]),
                presence_penalty=rnd.choice([0, 0.5]), frequency_penalty=rnd.choice([0, 0.3]),
                logit_bias=rnd.choice([(), ((3, -math.inf), (10, 5.0))]), n_probs=rnd.choice([0, 3]),
            )
            for _ in range(24)
        ]
        logits = torch.randn(24, vocab, generator=torch.Generator().manual_seed(trial)) * rnd.choice([1, 3, 8])
        history = [[rnd.randrange(vocab) for _ in range(50)] for _ in params]
        rngs = [SequenceRng(rnd.randrange(2**32)) for _ in params]
        probes = copy.deepcopy(rngs)
        uniforms = [0.0 if p.greedy else r.next_uniform() for p, r in zip(params, probes)]
        tokens = Sampler(vocab).sample(logits, params, rngs, history).tokens.tolist()
        want = [reference_token(logits[i].numpy(), p, uniforms[i], history[i]) for i, p in enumerate(params)]
        assert tokens == want


def test_n_probs_report_the_models_own_probabilities_before_bias_and_penalties():
    """As llama-server: with a token forbidden by logit_bias (as ignore_eos does to end-of-generation),
    its probability is still the model's, and penalties do not change the report either."""
    logits = torch.randn(3, 500, generator=torch.Generator().manual_seed(4))
    top = int(logits[0].argmax())
    params = [
        SamplingParams(n_probs=5, logit_bias=((top, -math.inf),)),
        SamplingParams(temperature=0, n_probs=2, repeat_penalty=5.0),
        SamplingParams(),
    ]
    history = [[], [int(logits[1].argmax())], []]
    out = Sampler(500).sample(logits, params, [SequenceRng(i) for i in range(3)], history)
    assert out.top_ids.shape == (3, 5) and out.top_logprobs.dtype == torch.float32
    reference = torch.log_softmax(logits, dim=1)
    assert torch.equal(out.top_ids, reference.topk(5, dim=1).indices)
    assert torch.allclose(out.top_logprobs, reference.gather(1, out.top_ids), atol=1e-5)
    assert bool((out.top_logprobs[:, :-1] >= out.top_logprobs[:, 1:]).all())
    assert int(out.top_ids[0, 0]) == top and int(out.tokens[0]) != top  # reported, never sampled
    assert int(out.tokens[1]) != history[1][0]  # the penalty moved the greedy pick, not the report
    assert torch.allclose(out.logprobs, reference.gather(1, out.tokens[:, None]).squeeze(1), atol=1e-5)


FLOAT_FIELDS = {
    "temperature": lambda v: True,
    "top_p": lambda v: 0 <= v <= 1,
    "min_p": lambda v: 0 <= v <= 1,
    "repeat_penalty": lambda v: v > 0,
    "presence_penalty": lambda v: True,
    "frequency_penalty": lambda v: True,
}


@settings(max_examples=300, deadline=None)
@given(field=st.sampled_from(sorted(FLOAT_FIELDS)), value=st.floats(allow_nan=True, allow_infinity=True))
def test_float_params_are_validated_with_their_name(field, value):
    if math.isfinite(value) and FLOAT_FIELDS[field](value):
        assert getattr(SamplingParams(**{field: value}), field) == value
    else:
        with pytest.raises(SamplingError, match=field):
            SamplingParams(**{field: value})


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("top_k", 1.5),
        ("top_k", True),
        ("repeat_last_n", -2),
        ("n_probs", -1),
        ("n_probs", 101),
        ("seed", -2),
        ("temperature", "hot"),
        ("logit_bias", ((1, math.nan),)),
        ("logit_bias", ((1, math.inf),)),
        ("logit_bias", ((-1, 1.0),)),
        ("logit_bias", (1, 2, 3)),
    ],
)
def test_invalid_params_name_the_parameter(field, value):
    with pytest.raises(SamplingError, match=field):
        SamplingParams(**{field: value})


def test_bad_inputs_are_rejected_clearly():
    sampler = Sampler(8)
    with pytest.raises(SamplingError, match="logit_bias"):
        sampler.sample(LOGITS[None], [SamplingParams(logit_bias=((8, 1.0),))], [SequenceRng(0)], [[]])
    everything = SamplingParams(logit_bias=tuple((t, -math.inf) for t in range(8)))
    with pytest.raises(SamplingError, match="forbids every token"):
        sampler.sample(LOGITS[None], [everything], [SequenceRng(0)], [[]])
    with pytest.raises(SamplingError, match="NaN"):
        sampler.sample(torch.full((1, 8), math.nan), [SamplingParams()], [SequenceRng(0)], [[]])
    with pytest.raises(SamplingError, match="logits must be"):
        sampler.sample(torch.zeros(1, 9), [SamplingParams()], [SequenceRng(0)], [[]])
    with pytest.raises(SamplingError, match="history"):
        sampler.sample(LOGITS[None], [SamplingParams(repeat_penalty=1.1)], [SequenceRng(0)], [[8]])


@pytest.mark.parametrize("vocab", [49152, 1001])   # 1001: the vector loops' scalar tails
def test_greedy_native_pass_equals_the_batched_sampler(vocab):
    """Greedy rows without probabilities take one C pass (slotserver/model/sampling/greedy.py); an
    all-true grammar mask forces the batched torch path: same tokens, with logit_bias forbidding
    (ignore_eos's -inf), forcing, repeated ids adding up, ties going to the lowest id, -0.0 vs 0.0,
    and the same error for a row with NaN or with every token forbidden."""
    gen = torch.Generator().manual_seed(vocab)
    logits = torch.randn(6, vocab, generator=gen)
    top = logits.argmax(dim=1)
    logits[1, [5, 900, vocab - 1]] = 50.0                        # a tie: the lowest id wins
    logits[2] = 0.0
    logits[3, 9] = -10.0                                        # only both biases together lift it
    logits[2, [3, 8]] = -0.0
    bias = [(), ((int(top[0]), -math.inf),), ((int(top[1]), -math.inf), (7, 1.5)), ((9, 10.0), (9, 10.0)),
            ((vocab - 1, 100.0),), ((0, -1.0), (0, 1.0))]
    params = [SamplingParams(temperature=0.0, logit_bias=b) for b in bias]
    sampler, rngs, hist = Sampler(vocab), [SequenceRng(0) for _ in range(6)], [[1, 2, 3]] * 6
    fast = sampler.sample(logits, params, rngs, hist)
    slow = sampler.sample(logits, params, rngs, hist, torch.ones(6, vocab, dtype=torch.bool))
    assert torch.equal(fast.tokens, slow.tokens) and int(fast.tokens[3]) == 9 and int(fast.tokens[4]) == vocab - 1
    bad = logits.clone()
    bad[4, 17] = math.nan
    for allowed in (None, torch.ones(6, vocab, dtype=torch.bool)):
        with pytest.raises(SamplingError, match="row 4"):
            sampler.sample(bad, params, rngs, hist, allowed)
    every = [SamplingParams(temperature=0.0, logit_bias=tuple((t, -math.inf) for t in range(vocab)))]
    with pytest.raises(SamplingError, match="row 0"):
        sampler.sample(logits[:1], every, rngs[:1], hist[:1])


@pytest.mark.parametrize("vocab", [49152, 1001])   # 1001: the vector loop's scalar tail
def test_truncated_native_pass_draws_what_the_batched_sampler_draws(vocab):
    """Rows truncated by top_k (llama-server's default chain, what nearly every request runs) take one
    C pass (slotserver/model/sampling/truncated.py); an all-true grammar mask forces the batched torch
    path. Same tokens for every seed, over top_k 1-256 with top_p, min_p, temperatures, greedy rows,
    logit_bias, the repeat/frequency/presence penalties over windows of repeated tokens, and rows with
    fewer finite logits than top_k; a NaN row fails before any row draws, so
    each row's stream is where the batched path leaves it. Tied logits (half the trials round the
    logits to bfloat16) keep the lower id first on both paths (the batched path draws from the
    native pass's candidates), so all-equal logits draw only the top_k lowest ids."""
    from slotserver.model.sampling import truncated
    if truncated._LIB is None:
        pytest.skip("the native pass needs the C compiler (SLOTSERVER_NATIVE=0 or none)")
    rnd, gen = random.Random(vocab), torch.Generator().manual_seed(vocab)
    sampler, mask = Sampler(vocab), torch.ones(16, vocab, dtype=torch.bool)
    for trial in range(12):
        params = [SamplingParams(temperature=rnd.choice([0, 0.2, 0.8, 1.5]), top_k=rnd.choice([1, 2, 40, 256]),
                                 top_p=rnd.choice([1.0, 0.95, 0.5, 0.0]), min_p=rnd.choice([0, 0.05, 0.3]),
                                 logit_bias=rnd.choice([(), ((3, -math.inf), (10, 5.0), (10, 1.0))]),
                                 repeat_penalty=rnd.choice([1.0, 1.3]), repeat_last_n=rnd.choice([0, 8, -1]),
                                 presence_penalty=rnd.choice([0, 0.5]), frequency_penalty=rnd.choice([0, 0.3]))
                  for _ in range(16)]
        history = [[rnd.randrange(50) for _ in range(40)] for _ in params]   # repeats: counts above 1
        logits = torch.randn(16, vocab, generator=gen) * rnd.choice([1, 4, 12])
        if trial % 2:   # ties (bfloat16-like logits): the same candidates, in the same order, on both paths
            logits = logits.to(torch.bfloat16).float()
        logits[trial % 16, 40:] = -math.inf                             # fewer finite logits than some top_k
        seeds = [rnd.randrange(2**32) for _ in params]
        fast_rngs, slow_rngs = [SequenceRng(x) for x in seeds], [SequenceRng(x) for x in seeds]
        for _ in range(3):   # the streams move on together
            fast = sampler.sample(logits, params, fast_rngs, history).tokens
            slow = sampler.sample(logits, params, slow_rngs, history, mask).tokens
            assert fast.tolist() == slow.tolist(), trial
            for h, t in zip(history, fast.tolist()):
                h.append(t)
    bad = logits.clone()
    bad[5, 17] = math.nan
    with pytest.raises(SamplingError, match="row 5"):
        sampler.sample(bad, params, fast_rngs, [[]] * 16)
    assert [r.next_uniform() for r in fast_rngs] == [r.next_uniform() for r in slow_rngs]   # no draw was made
    flat = [SamplingParams(temperature=1.0, top_k=3, top_p=1.0, min_p=0.0)] * 16
    drawn = sampler.sample(torch.zeros(16, vocab), flat, [SequenceRng(x) for x in range(16)], [[]] * 16).tokens
    assert set(drawn.tolist()) == {0, 1, 2}


@pytest.mark.parametrize("bias", [False, True])   # probabilities from the adjusted logits, or from the raw ones
def test_a_rows_reported_logprobs_are_the_same_bits_in_any_batch(bias):
    """Issue 32 (4): a row's reported log-probabilities must not depend on the rows beside it (the
    docs promise a row's floats never do); a batched logsumexp differed by up to 1.9e-6. 64 rows
    (greedy with n_probs, as a scoring client asks; the vocabularies of SmolLM2, a 64 K one and
    qwen2) alone, in batches of 8 and all together report the same bits. (Under the batched form
    2 to 6 of each vocabulary's 64 rows differed on a 2-core host, at 2, 3 and 4 threads.)"""
    for vocab in (49152, 65536, 151936):
        pool = torch.randn(64, vocab, generator=torch.Generator().manual_seed(1)) * 3   # [64, vocab]
        p = SamplingParams(temperature=0, n_probs=5, logit_bias=((11, -2.0),) if bias else ())
        sampler = Sampler(vocab)

        def report(rows: torch.Tensor) -> tuple[torch.Tensor, ...]:
            out = sampler.sample(rows, [p] * len(rows), [SequenceRng(0) for _ in rows], [[]] * len(rows))
            return out.logprobs, out.top_logprobs, out.top_ids

        alone = [report(pool[i : i + 1].clone()) for i in range(len(pool))]
        for start, size in [(s, 8) for s in range(0, 64, 8)] + [(0, 64)]:
            together = report(pool[start : start + size])
            for j in range(size):
                for a, t in zip(alone[start + j], together):
                    assert torch.equal(a[0], t[j]), (vocab, size, start + j, float((a[0] - t[j]).abs().max()))
