"""When the engine's stats snapshot is published (engine/stats_tracker.py): decode-only steps at most
every PUBLISH_EVERY_S, but admissions, finished requests and an idle engine at once, so what /slots
and /metrics show after a request ends is never stale."""

from __future__ import annotations

from pathlib import Path

import pytest

import slotserver.engine.stats_tracker as stats_tracker
from slotserver.engine.config import EngineConfig
from slotserver.engine.engine import Engine
from slotserver.engine.request import Request
from slotserver.model.bundle import ModelBundle
from slotserver.model.config import ModelConfig
from slotserver.model.sampling.params import SamplingParams

MODEL = Path(__file__).parent / "fixtures" / "archs" / "qwen3.gguf"
GREEDY = SamplingParams(temperature=0, seed=1)


@pytest.fixture(scope="module")
def bundle():
    return ModelBundle.load(ModelConfig(MODEL, threads=1))


def _engine(bundle) -> Engine:
    return Engine(bundle, EngineConfig(n_parallel=2, ctx_size=512))


def test_decode_steps_within_the_interval_leave_the_snapshot_as_it_was(bundle, monkeypatch):
    monkeypatch.setattr(stats_tracker, "PUBLISH_EVERY_S", 3600.0)
    e = _engine(bundle)
    h = e.submit(Request((1, 2, 3), GREEDY, n_predict=6, ignore_eos=True))
    e.step()   # admission (published) and the first token
    admitted = e.stats()
    assert admitted.slots[h.seq.slot_id].state == "processing"
    e.step(), e.step()
    assert e.stats() is admitted   # two decode steps: not republished
    while e.step():
        pass
    done = e.stats()   # the step that finished the request published at once
    assert done.requests_done == 1 and done.n_active == 0 and done.predicted_tokens == 6
    assert [s.state for s in done.slots] == ["idle", "idle"]
    assert len(h.result(timeout=0).tokens) == 6


def test_every_step_publishes_once_the_interval_has_passed(bundle, monkeypatch):
    monkeypatch.setattr(stats_tracker, "PUBLISH_EVERY_S", 0.0)
    e = _engine(bundle)
    e.submit(Request((1, 2, 3), GREEDY, n_predict=6, ignore_eos=True))
    e.step()
    seen = []
    for _ in range(3):
        e.step()
        seen.append(e.stats().predicted_tokens)
    assert seen == [2, 3, 4]


def test_published_slots_are_whole_slot_stats(bundle, monkeypatch):
    """Each published step shows every slot's state and counts, frozen, and a token rate."""
    monkeypatch.setattr(stats_tracker, "PUBLISH_EVERY_S", 0.0)
    e = _engine(bundle)
    e.submit(Request((1, 2, 3), GREEDY, n_predict=4, ignore_eos=True))
    e.step(), e.step()
    slots = e.tracker.snapshot.slots
    assert [s.state for s in slots] == ["processing", "idle"] and slots[0].n_generated == 2
    with pytest.raises(AttributeError):
        slots[0].n_generated = 5
    assert e.stats().tokens_per_second > 0
