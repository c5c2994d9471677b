"""The device sampler (model/sampling/device.py) against the host `Sampler` on the same logits and
seeds: the same tokens, the same random draws, the same reported probabilities. It is plain torch,
so these tests run it on CPU tensors; the last one runs StepSampling on a GPU when there is one.

Logits are a permutation of about evenly spaced values (neighbours at least 0.6 of a step apart, and
no two equal after penalties and biases), so rounding differences between the two implementations
cannot flip a choice."""

from __future__ import annotations

import math
import random
from types import SimpleNamespace

import pytest
import torch

from slotserver.engine.request import Request
from slotserver.engine.step_sampling import StepSampling
from slotserver.model.sampling.device import DeviceSampler
from slotserver.model.sampling.sampler import Sampler, SamplingError, SamplingParams, SequenceRng


def spaced_logits(gen: torch.Generator, rows: int, vocab: int, spread: float) -> torch.Tensor:
    """[rows, vocab]: each row a shuffle of `vocab` values about evenly spaced over `spread`, each
    moved by a random fraction of a step, so no penalty or bias lands one exactly on another (equal
    values are ordered by id on the device, in the CPU topk's own order by the host's fast path)."""
    perm = torch.stack([torch.randperm(vocab, generator=gen) for _ in range(rows)]).float()
    jitter = 0.4 * torch.rand(rows, vocab, generator=gen)
    return (perm + jitter) * (spread / vocab) - spread / 2


def random_params(r: random.Random, vocab: int) -> SamplingParams:
    bias = tuple((r.randrange(vocab), r.choice([-math.inf, 2.5, -0.75])) for _ in range(r.choice([0, 0, 2])))
    return SamplingParams(
        temperature=r.choice([0.0, 0.5, 0.8, 1.3]), top_k=r.choice([0, 1, 5, 40, 5000]),
        top_p=r.choice([1.0, 0.9, 0.5]), min_p=r.choice([0.0, 0.05, 0.2]),
        repeat_penalty=r.choice([1.0, 1.3]), frequency_penalty=r.choice([0.0, 0.5]),
        presence_penalty=r.choice([0.0, 0.3]), repeat_last_n=r.choice([64, -1, 0]), logit_bias=bias,
        n_probs=r.choice([0, 3]), post_sampling_probs=r.choice([False, True]))


def random_batch(r: random.Random, gen: torch.Generator, rows: int, vocab: int, spreads=(1.0, 8.0, 30.0)):
    logits = spaced_logits(gen, rows, vocab, r.choice(spreads))   # 1.0: flat, top_p ends far down
    params = [random_params(r, vocab) for _ in range(rows)]
    history = [[r.randrange(vocab) for _ in range(r.randrange(100))] for _ in range(rows)]
    allowed = None
    if r.random() < 0.5:   # a grammar on some rows; the others free (all True)
        allowed = torch.ones(rows, vocab, dtype=torch.bool)
        for i in range(rows):
            if r.random() < 0.5:
                allowed[i] = torch.rand(vocab, generator=gen) < 0.3
    return logits, params, history, allowed


def assert_same_output(host, dev):
    assert dev.tokens.tolist() == host.tokens.tolist()
    assert (host.logprobs is None) == (dev.logprobs is None)
    if host.logprobs is None:
        return
    assert torch.allclose(dev.logprobs, host.logprobs, atol=1e-5, rtol=0)
    finite = host.top_logprobs.isfinite()
    assert torch.equal(dev.top_logprobs.isfinite(), finite)       # the same number of reported tokens
    assert torch.equal(dev.top_ids[finite], host.top_ids[finite])
    assert torch.allclose(dev.top_logprobs[finite], host.top_logprobs[finite], atol=1e-5, rtol=0)


@pytest.mark.parametrize("vocab", [1001, 1024])   # 1001: a mask's last byte half used; 1024: the host's blocked top-k
def test_the_device_sampler_gives_the_host_samplers_tokens_and_probabilities(vocab):
    """Random chains (greedy and drawn; top_k/top_p/min_p; penalties over histories; logit_bias
    with -inf; grammar masks; n_probs raw and post-sampling), each row with its own seed: the same
    tokens and probabilities as the host, and each row's random stream advanced as far."""
    r, gen = random.Random(vocab), torch.Generator().manual_seed(vocab)
    for _ in range(25):   # 300 rows a vocabulary (1000 batches of 1-20 rows agreed when this was written)
        logits, params, history, allowed = random_batch(r, gen, 12, vocab)
        seeds = [r.randrange(2**32) for _ in params]
        host_rngs, dev_rngs = [SequenceRng(s) for s in seeds], [SequenceRng(s) for s in seeds]
        host = Sampler(vocab).sample(logits, params, host_rngs, history, allowed)
        res = DeviceSampler(vocab).sample(logits, params, dev_rngs, history, allowed)
        assert res.bad == []
        assert_same_output(host, res.output)
        assert [g.next_uniform() for g in dev_rngs] == [g.next_uniform() for g in host_rngs]


def test_an_open_row_on_a_flat_distribution_is_redone_over_the_whole_vocabulary():
    """top_p 0.99 without top_k on a flat row: the kept set reaches far past the first pass's
    candidates; the device redoes that row sorted in full and still draws the host's token."""
    vocab = 3000
    logits = spaced_logits(torch.Generator().manual_seed(3), 4, vocab, 0.5)
    params = [SamplingParams(top_k=0, top_p=0.99, min_p=0.0, temperature=1.0, n_probs=2)] * 4
    host = Sampler(vocab).sample(logits, params, [SequenceRng(i) for i in range(4)], [[]] * 4)
    res = DeviceSampler(vocab).sample(logits, params, [SequenceRng(i) for i in range(4)], [[]] * 4)
    assert_same_output(host, res.output)
    ranks = (logits > logits.gather(1, res.output.tokens[:, None])).sum(dim=1)
    assert int(ranks.max()) > 256   # some draw lies beyond the first pass's 256 candidates


def test_plain_greedy_rows_take_one_argmax_and_a_nan_row_comes_back_as_bad():
    """A batch of plain greedy rows (the benchmark clients' case) is one argmax pass; a NaN row in
    it is reported in `bad` (the caller fails that request) and the other rows keep their argmax."""
    logits = spaced_logits(torch.Generator().manual_seed(4), 3, 300, 10.0)
    params = [SamplingParams(temperature=0.0, logit_bias=((7, 50.0),)), SamplingParams(temperature=0.0),
              SamplingParams(temperature=0.0)]
    res = DeviceSampler(300).sample(logits, params, [SequenceRng(0)] * 3, [[]] * 3)
    assert res.bad == [] and res.output.tokens.tolist() == [7, int(logits[1].argmax()), int(logits[2].argmax())]
    logits[1, 5] = float("nan")
    res = DeviceSampler(300).sample(logits, params, [SequenceRng(0)] * 3, [[]] * 3)
    assert res.bad == [1] and res.output.tokens[[0, 2]].tolist() == [7, int(logits[2].argmax())]
    with pytest.raises(SamplingError, match=r"logits must be \[batch, 300\]"):
        DeviceSampler(300).sample(logits[:, :200], params, [SequenceRng(0)] * 3, [[]] * 3)


def test_equal_logits_give_a_seed_the_same_token_alone_or_beside_any_row():
    """Logits with many exact ties (as a bf16 output layer gives), cut by top_k inside a run of
    equal values: a seed draws the same token whether its row is alone or beside rows that widen
    the candidates (ties in id order, the cut by id), and a tied post-sampling report lists ids
    in increasing order."""
    vocab = 512
    logits = (8 * torch.randn(1, vocab, generator=torch.Generator().manual_seed(6))).round() / 4   # steps of 1/4
    p = SamplingParams(temperature=1.0, top_k=40, top_p=1.0, min_p=0.0)
    others = [SamplingParams(temperature=1.0, top_k=300), SamplingParams(temperature=1.0, top_k=0, top_p=0.9)]
    for seed in range(40):
        alone = DeviceSampler(vocab).sample(logits, [p], [SequenceRng(seed)], [[]]).output.tokens[0]
        beside = DeviceSampler(vocab).sample(logits.expand(3, -1), [*others, p], [SequenceRng(1), SequenceRng(2),
                                             SequenceRng(seed)], [[]] * 3).output.tokens[2]
        assert alone == beside
    post = SamplingParams(temperature=1.0, top_k=40, top_p=1.0, min_p=0.0, post_sampling_probs=True, n_probs=40)
    out = DeviceSampler(vocab).sample(logits, [post], [SequenceRng(0)], [[]]).output
    ids, lps = out.top_ids[0].tolist(), out.top_logprobs[0].tolist()
    assert any(a == b for a, b in zip(lps, lps[1:]))                    # the report holds ties
    assert all(i < j for i, j, a, b in zip(ids, ids[1:], lps, lps[1:]) if a == b)


def seq(params: SamplingParams, seed: int, tokens=(), reasoning=None):
    return SimpleNamespace(params=params, rng=SequenceRng(seed), tokens=list(tokens), reasoning=reasoning)


def plan_of(seqs):
    return SimpleNamespace(chunks=[SimpleNamespace(sample=True, seq=s, draft=()) for s in seqs])


def mixed_step(vocab: int):
    """Rows of every kind: plain ones (device), DRY / mirostat / typical_p / min_keep (host), a
    grammar row, a NaN row and a row whose mask forbids every token."""
    p = [SamplingParams(temperature=0.8, n_probs=2), SamplingParams(temperature=0.0, repeat_penalty=1.2),
         SamplingParams(temperature=0.9, dry_multiplier=0.8), SamplingParams(temperature=0.7, mirostat=2),
         SamplingParams(temperature=0.7, typical_p=0.8, n_probs=3), SamplingParams(temperature=1.0, min_keep=3),
         SamplingParams(temperature=0.6, top_k=0, post_sampling_probs=True, n_probs=4),
         SamplingParams(temperature=0.5), SamplingParams(temperature=0.5)]
    logits = spaced_logits(torch.Generator().manual_seed(5), len(p), vocab, 12.0)
    logits[7, 3] = float("nan")
    allowed = torch.ones(len(p), vocab, dtype=torch.bool)
    allowed[0, ::3] = False
    allowed[8] = False
    return p, logits, allowed


def test_step_sampling_on_the_device_path_answers_as_the_host_path():
    """The same step through StepSampling's device split (plain rows on the device sampler, the
    others copied to the host) and through the host path: the same tokens, probabilities and
    per-request errors (the NaN row names NaN logits; the others are untouched)."""
    vocab = 500
    params, logits, allowed = mixed_step(vocab)
    runs = {}
    for on_device in (True, False):
        seqs = [seq(p, 100 + i, tokens=range(i, 40 + i)) for i, p in enumerate(params)]
        sampling = StepSampling(vocab, on_device=on_device)
        runs[on_device] = [r[0] for r in sampling.sample(plan_of(seqs), logits, allowed)]
    dev, host = runs[True], runs[False]
    assert [s.token for s in dev] == [s.token for s in host]
    assert [s.error for s in dev] == [s.error for s in host]
    assert "NaN" in dev[7].error and dev[8].error and not any(s.error for s in dev[:7])
    assert dev[0].token % 3 != 0                      # the grammar row kept to its mask
    for d, h, p in zip(dev, host, params):
        assert [t for t, _ in d.top] == [t for t, _ in h.top]
        assert all(abs(a - b) < 1e-5 for (_, a), (_, b) in zip(d.top, h.top))
        assert not p.n_probs or abs(d.logprob - h.logprob) < 1e-5   # the rows that asked for it


def test_a_small_step_samples_only_its_greedy_rows_on_the_device(monkeypatch):
    """Below device_min_rows (DEVICE_MIN_ROWS in service: measured on an H100) top-k/probability
    rows go to the host sampler and greedy rows stay on the device; the answers are the host's."""
    vocab = 500
    params = [SamplingParams(temperature=0.8, top_k=20, seed=1), SamplingParams(temperature=0.0, repeat_penalty=1.2)]
    logits = spaced_logits(torch.Generator().manual_seed(9), len(params), vocab, 12.0)
    served = []
    runs = {}
    for name, kw in (("small", dict(on_device=True, device_min_rows=8)), ("host", dict(on_device=False))):
        sampling = StepSampling(vocab, **kw)
        real = sampling.device.sample
        monkeypatch.setattr(sampling.device, "sample", lambda lg, ps, *a, **k: served.append(len(ps)) or real(lg, ps, *a, **k))
        seqs = [seq(p, 100 + i, tokens=range(i, 40 + i)) for i, p in enumerate(params)]
        runs[name] = [r[0].token for r in sampling.sample(plan_of(seqs), logits, None)]
    assert served == [1]                         # the greedy row alone went to the device sampler
    assert runs["small"] == runs["host"]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_step_sampling_on_cuda_logits_answers_as_on_cpu_logits():
    """On the GPU: the device sampler on CUDA logits against the host path on the same logits."""
    vocab = 151936
    r, gen = random.Random(9), torch.Generator().manual_seed(9)
    for _ in range(4):
        # peaked rows: a float32 cumsum over 152k flat tokens rounds differently on the two devices
        logits, params, history, allowed = random_batch(r, gen, 16, vocab, spreads=(2000.0, 5000.0))
        out = {}
        for dev in ("cpu", "cuda"):
            seqs = [SimpleNamespace(params=p, rng=SequenceRng(i), tokens=h, reasoning=None)
                    for i, (p, h) in enumerate(zip(params, history))]
            out[dev] = [x[0] for x in StepSampling(vocab).sample(plan_of(seqs), logits.to(dev), allowed)]
        assert [s.token for s in out["cuda"]] == [s.token for s in out["cpu"]]
        for d, h in zip(out["cuda"], out["cpu"]):
            assert [t for t, _ in d.top] == [t for t, _ in h.top]
            assert all(abs(a - b) < 1e-4 for (_, a), (_, b) in zip(d.top, h.top))


def test_the_engine_answers_the_same_through_the_device_path(tmp_path):
    """A whole engine on the tiny model (CPU), its StepSampling switched to the device path:
    seeded draws, penalties, a grammar, post-sampling probabilities and a DRY row (host) give the
    host path's tokens and probabilities, event for event."""
    from tiny_gguf import write_tiny_gguf

    from slotserver.engine.config import EngineConfig
    from slotserver.engine.engine import Engine
    from slotserver.engine.grammar import compile_constraint
    from slotserver.engine.request import Request, TokenEvent
    from slotserver.model.bundle import ModelBundle
    from slotserver.model.config import ModelConfig

    bundle = ModelBundle.load(ModelConfig(model_path=write_tiny_gguf(tmp_path / "t.gguf"), threads=1))
    requests = [
        Request((5, 6, 7), SamplingParams(temperature=0.9, seed=1, n_probs=3), n_predict=10, ignore_eos=True),
        Request((8, 9), SamplingParams(temperature=0.0, repeat_penalty=1.5, n_probs=2), n_predict=10, ignore_eos=True),
        Request((5, 9), SamplingParams(temperature=0.7, seed=2), n_predict=6,
                grammar=compile_constraint("gbnf", 'root ::= ("a" | "b" | "c")+')),
        Request((7, 7), SamplingParams(temperature=1.1, top_k=0, top_p=0.9, seed=3, n_probs=2,
                                       post_sampling_probs=True), n_predict=10, ignore_eos=True),
        Request((6, 5), SamplingParams(temperature=0.8, seed=4, dry_multiplier=0.8), n_predict=10, ignore_eos=True),
    ]
    events = {}
    for on_device in (True, False):
        engine = Engine(bundle, EngineConfig(n_parallel=5, ctx_size=256))
        engine.sampling.on_device = on_device
        handles = [engine.submit(r) for r in requests]
        while engine.step():
            pass
        events[on_device] = [[e for e in h.iter_events(timeout=0) if isinstance(e, TokenEvent)] for h in handles]
    for dev, host in zip(events[True], events[False]):
        assert [e.token for e in dev] == [e.token for e in host] and len(host) > 2
        for d, h in zip(dev, host):
            assert [t for t, _ in d.top] == [t for t, _ in h.top]
            assert all(abs(a - b) < 1e-5 for (_, a), (_, b) in zip(d.top, h.top))


def test_overlapped_steps_sample_seeded_rows_on_the_device_as_the_host_does(tmp_path):
    """--async-steps on with the device sampler (run on CPU tensors): seeded rows with llama-server's
    default chain (top_k 40) are sampled without waiting, so their steps overlap, and every client
    sees what the host path without overlap gives; a row the device cannot sample ahead (penalties)
    keeps its steps landed."""
    from async_steps_fixtures import drive, make_engine, prompts, same_answers
    from tiny_gguf import write_tiny_gguf

    path = write_tiny_gguf(tmp_path / "t.gguf", n_layers=2, d_model=32, n_heads=4, n_kv_heads=2, d_ff=64,
                           ctx_len=512, seed=3)
    seeded = [SamplingParams(temperature=0.8, seed=s) for s in (1, 2, 3)]
    reqs = [Request(p, s, n_predict=12, ignore_eos=True) for p, s in zip(prompts(3), seeded)]
    host = drive(make_engine(path, "off"), {0: reqs})
    overlapped = make_engine(path, "on")
    overlapped.sampling.on_device = True
    same_answers(host, drive(overlapped, {0: reqs}))
    cpu_path = make_engine(path, "on")                  # the host sampler: these steps land, none overlaps
    same_answers(host, drive(cpu_path, {0: reqs}))
    assert overlapped.overlap.launched >= 8 and cpu_path.overlap.launched == 0
    penalized = Request(prompts(1)[0], SamplingParams(temperature=0.8, seed=4, repeat_penalty=1.3), n_predict=6)
    landed = make_engine(path, "on")
    landed.sampling.on_device = True
    same_answers(drive(make_engine(path, "off"), {0: [penalized]}), drive(landed, {0: [penalized]}))
    assert landed.overlap.launched == 0
