"""Overlapped decode steps on a CUDA device (skipped without one): the engine's default there
(--async-steps auto) against overlap off. The CPU tests of the same logic: tests/test_async_steps.py."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from async_steps_fixtures import GREEDY, drive, model_path, one_torch_thread, prompts, same_answers  # noqa: F401

from slotserver.engine.config import EngineConfig
from slotserver.engine.engine import Engine
from slotserver.engine.request import Request
from slotserver.model.bundle import ModelBundle
from slotserver.model.config import ModelConfig


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
