"""The server loads the model and runs every forward on one thread, which is not the main thread.

Why a user cares: torch's OpenMP runtime (libgomp) keeps a thread team per thread that has run a
parallel op and stops spin-waiting once there are more OpenMP threads than cores. A server that
loaded on one thread and decoded on another ran each decode step ~1.6x slower on 2 cores
(docs/performance.md). This pins the contract that avoids it, and that stopping still works.
"""

from __future__ import annotations

import gc
import threading
import time

from tiny_gguf import write_tiny_gguf

from slotserver.model.bundle import ModelBundle
from slotserver.model.config import ModelConfig
from slotserver.engine.config import EngineConfig
from slotserver.model.model import LlamaModel
from slotserver.engine.request import Request
from slotserver.model.sampling.sampler import SamplingParams
from slotserver.server.launch import LaunchPlan, ModelThread
from slotserver.server.state import ServerState


def _wait_loaded(state: ServerState, failures: list) -> None:
    deadline = time.monotonic() + 60
    while state.engine is None and not failures and time.monotonic() < deadline:
        time.sleep(0.01)
    assert state.engine is not None, failures


def test_model_thread_loads_and_decodes_on_one_thread_then_stops(tmp_path, monkeypatch):
    seen: dict[str, set[int]] = {"load": set(), "forward": set()}
    load, forward = ModelBundle.load.__func__, LlamaModel.forward

    def spy_load(cls, *args, **kwargs):
        seen["load"].add(threading.get_ident())
        return load(cls, *args, **kwargs)

    def spy_forward(self, *args, **kwargs):
        seen["forward"].add(threading.get_ident())
        return forward(self, *args, **kwargs)

    monkeypatch.setattr(ModelBundle, "load", classmethod(spy_load))
    monkeypatch.setattr(LlamaModel, "forward", spy_forward)
    plan = LaunchPlan(ModelConfig(write_tiny_gguf(tmp_path / "tiny.gguf")), EngineConfig(n_parallel=2, ctx_size=256),
                      watch=False)
    state, failures = ServerState(), []
    model = ModelThread(state, plan, "http://test", failures.append).start()
    try:
        _wait_loaded(state, failures)
        greedy = SamplingParams(temperature=0.0)
        done = [state.engine.submit(Request((5, 6, 7), greedy, n_predict=4, ignore_eos=True)) for _ in range(2)]
        assert all(len(h.result(timeout=60).tokens) == 4 for h in done)
    finally:
        model.stop(timeout=10)
    assert not model.thread.is_alive(), "the engine loop did not stop"
    assert len(seen["load"]) == 1 and seen["forward"] == seen["load"]
    assert threading.main_thread().ident not in seen["load"]


def test_a_start_up_with_the_collector_paused_resumes_it_once_loaded(tmp_path):
    """`slotserver serve` pauses the cyclic garbage collector for start-up (importing torch and
    reading the GGUF took ~0.3 s of collections that found nothing); the server must not then run
    without it, or cycles made by requests would never be freed."""
    plan = LaunchPlan(ModelConfig(write_tiny_gguf(tmp_path / "tiny.gguf")), EngineConfig(n_parallel=1, ctx_size=256),
                      watch=False, gc_paused=True)
    state, failures = ServerState(), []
    gc.disable()
    try:
        model = ModelThread(state, plan, "http://test", failures.append).start()
        try:
            _wait_loaded(state, failures)
            deadline = time.monotonic() + 10
            while not gc.isenabled() and time.monotonic() < deadline:
                time.sleep(0.01)
            assert gc.isenabled()
        finally:
            model.stop(timeout=10)
    finally:
        gc.enable()
        gc.unfreeze()   # what the thread froze was this test process's objects
