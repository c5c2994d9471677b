"""The CPU forward's thread count follows what is faster now (engine/thread_tuner.py): a host whose
cores are taken by other work gets one-thread steps, a host that quiets down gets -t back, and the
switch changes no answer."""

from __future__ import annotations

import pytest
import torch

from slotserver.engine.config import EngineConfig
from slotserver.engine.engine import Engine
from slotserver.engine.thread_tuner import MAX_PERIOD_S, ThreadTuner
from slotserver.errors import ConfigError
from slotserver.model.bundle import ModelBundle
from slotserver.model.config import ModelConfig
from slotserver.model.generate import GenRequest, generate
from slotserver.model.sampling.params import SamplingParams
from slotserver.runtime import native


class Host:
    """A fake clock and step times: `cost[n]` seconds a step with n threads."""

    def __init__(self, cost: dict[int, float]) -> None:
        self.now, self.cost, self.threads, self.sets = 0.0, cost, 2, []

    def set(self, n: int) -> None:
        self.threads = n
        self.sets.append(n)

    def steps(self, tuner: ThreadTuner, n_steps: int, size: int = 8) -> list[int]:
        used = []
        for _ in range(n_steps):
            n = tuner.choose(size)
            assert n == self.threads
            cost = self.cost[(size, n)] if (size, n) in self.cost else self.cost[n]
            self.now += cost
            tuner.record(size, n, cost)
            used.append(n)
        return used


def _tuner(host: Host) -> ThreadTuner:
    return ThreadTuner(2, host.set, lambda: host.threads, clock=lambda: host.now)


def test_busy_cores_get_one_thread_steps_and_free_cores_get_the_threads_back():
    host = Host({1: 0.013, 2: 0.176})   # measured on the shared 2-core host: 13 vs 107-362 ms
    tuner = _tuner(host)
    used = host.steps(tuner, 200)
    assert tuner.last == 1 and used[-50:] == [1] * 50
    assert used.index(1) < 100         # the first probe, about a second in
    host.cost = {1: 0.013, 2: 0.008}   # the other work ended
    used = host.steps(tuner, 10_000)
    assert tuner.last == 2 and used[-50:] == [2] * 50
    assert tuner.switches == 2


def test_a_quiet_host_pays_few_probe_steps_and_keeps_its_threads():
    host = Host({1: 0.016, 2: 0.010})
    tuner = _tuner(host)
    used = host.steps(tuner, 30_000)   # 5 minutes of 10 ms steps
    assert tuner.last == 2 and tuner.switches == 0
    probes = used.count(1)
    assert 0 < probes <= 2 * (6 + 300 / MAX_PERIOD_S)   # periods 1, 2, 4 .. 32 s, then every 32 s
    tuner.restore()
    assert host.threads == 2


def test_decode_steps_and_prompt_chunks_choose_their_counts_separately():
    """Under the same load a decode step's small ops lose to their barriers, a prompt chunk's big
    matmuls still gain from two threads."""
    host = Host({(4, 1): 0.013, (4, 2): 0.176, (512, 1): 0.400, (512, 2): 0.250})
    tuner = _tuner(host)
    for _ in range(300):
        host.steps(tuner, 10, size=4)
        prompt = host.steps(tuner, 1, size=512)
    assert host.steps(tuner, 20, size=4) == [1] * 20
    assert prompt == [2] and tuner.switches == 1


def test_one_thread_is_not_tuned_and_an_unknown_mode_is_refused():
    host = Host({1: 0.01, 2: 0.5})
    tuner = ThreadTuner(1, host.set, lambda: host.threads, clock=lambda: host.now)
    assert not tuner.enabled and tuner.choose(8) == 1 and host.sets == []
    with pytest.raises(ConfigError, match="--adaptive-threads"):
        EngineConfig(adaptive_threads="on")


@pytest.mark.skipif(not native.enabled(), reason="the C kernels do not serve here (the tuner is off too)")
def test_one_or_two_threads_give_the_same_tokens_and_log_probs_bit_for_bit(smollm_path):
    """Why switching between two steps is allowed: the C kernels split by rows and heads, never a sum."""
    threads = torch.get_num_threads()
    try:
        for weights, dtype in (("auto", "auto"), ("dense", "float32")):
            bundle = ModelBundle.load(ModelConfig(smollm_path, weights=weights, dtype=dtype, threads=2))
            prompt = bundle.tokenizer.encode("Once upon a time there was a little", parse_special=True)
            req = GenRequest(list(prompt), 8, SamplingParams(temperature=0.0, n_probs=8), ignore_eos=True)
            out = {}
            for n in (1, 2):
                torch.set_num_threads(n)
                out[n] = [(r.tokens, r.top) for r in generate(bundle.model, [req] * 2, bundle.tokenizer.eog_ids)]
            assert out[1] == out[2], (weights, dtype)
    finally:
        torch.set_num_threads(threads)


def test_the_engine_reports_its_thread_count_and_off_keeps_it(smollm_path, monkeypatch):
    threads = torch.get_num_threads()
    try:
        bundle = ModelBundle.load(ModelConfig(smollm_path, threads=2))
        tuned = Engine(bundle, EngineConfig(n_parallel=1, ctx_size=256)).stats().threads
        assert tuned == (2 if native.enabled() else 0)
        assert Engine(bundle, EngineConfig(n_parallel=1, ctx_size=256, adaptive_threads="off")).stats().threads == 0
        monkeypatch.setattr(native, "_unavailable", {"rope"})   # one library failed to build: its torch form serves
        assert Engine(bundle, EngineConfig(n_parallel=1, ctx_size=256)).stats().threads == 0
        monkeypatch.setattr(native, "_unavailable", set())
        monkeypatch.setenv("SLOTSERVER_NATIVE", "0")   # the torch formulations: their floats follow -t
        assert Engine(bundle, EngineConfig(n_parallel=1, ctx_size=256)).stats().threads == 0
    finally:
        torch.set_num_threads(threads)
