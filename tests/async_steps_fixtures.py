"""Helpers of the overlapped-step tests (tests/test_async_steps.py on the CPU,
tests/test_device_async_steps.py on CUDA): a tiny engine per mode, a step-by-step driver with
arrivals and cancels, and the comparison of what two runs' clients saw."""

from __future__ import annotations

import pytest
from shift_fixtures import one_torch_thread  # noqa: F401  (autouse where imported)
from tiny_gguf import write_tiny_gguf

from slotserver.engine.config import EngineConfig
from slotserver.engine.engine import Engine
from slotserver.engine.request import FinalEvent, Request, TokenEvent
from slotserver.model.bundle import ModelBundle
from slotserver.model.config import ModelConfig
from slotserver.model.sampling.params import SamplingParams

GREEDY = SamplingParams(temperature=0.0)


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
