"""--sleep-idle-seconds in the engine: idle long enough, the weights and the KV memory go; the next
request brings them back and is answered as before the sleep (same greedy tokens), without a
prompt cache (the KV went with the sleep)."""

from __future__ import annotations

import time

import pytest

from slotserver.engine.config import EngineConfig
from slotserver.engine.engine import Engine
from slotserver.engine.request import Request
from slotserver.errors import ConfigError
from slotserver.model.bundle import ModelBundle
from slotserver.model.config import ModelConfig
from slotserver.model.sampling.params import SamplingParams
from tiny_gguf import write_tiny_gguf

PROMPT = (5, 17, 200, 33, 1, 90, 41, 7)


def _greedy(engine: Engine):
    return engine.submit(Request(PROMPT, SamplingParams(temperature=0.0), n_predict=6, ignore_eos=True)).result(30)


def _wait(predicate, timeout: float = 10.0) -> None:
    end = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.05)


@pytest.fixture()
def engine(tmp_path):
    bundle = ModelBundle.load(ModelConfig(write_tiny_gguf(tmp_path / "tiny.gguf"), threads=1))
    e = Engine(bundle, EngineConfig(n_parallel=2, ctx_size=128, sleep_idle_s=0.3)).start()
    yield e
    e.stop()


def test_an_idle_engine_sleeps_and_a_request_wakes_it_with_the_same_answer(engine):
    first = _greedy(engine)
    _wait(lambda: engine.sleeper.is_sleeping)
    assert engine.bundle.model.weights is None and engine.cache.layout is None and engine.cache.bytes_used() == 0
    assert all(not s.cached for s in engine.sched.slots.slots)
    again = _greedy(engine)
    assert again.tokens == first.tokens
    assert again.final.n_cached == 0 and first.final.n_prompt == again.final.n_prompt   # no prompt cache across a sleep
    assert not engine.sleeper.asleep and engine.bundle.model.weights is not None


def test_a_wake_request_reloads_without_a_generation(engine):
    _wait(lambda: engine.sleeper.is_sleeping)
    engine.sleeper.request_wake()
    assert not engine.sleeper.is_sleeping          # at once: /props must say awake after a waking route
    _wait(lambda: not engine.sleeper.asleep)
    assert engine.bundle.model.weights is not None and engine.cache.bytes_used() > 0
    assert engine.sleeper.n_sleeps == 1


def test_sleep_seconds_are_validated():
    with pytest.raises(ConfigError, match="--sleep-idle-seconds must be -1"):
        EngineConfig(sleep_idle_s=0)


def test_over_http_read_only_routes_let_it_sleep_and_others_wake_it(engine):
    """/health, /props, /models, /metrics answer while asleep and leave it asleep (llama-server's
    read-only set); /tokenize wakes it (is_sleeping false at once); a completion after a sleep
    gives the same text; the throughput gauges cover only what finished since the last scrape."""
    from starlette.testclient import TestClient

    from slotserver.server import ServerConfig, ServerState, create_app

    state = ServerState(ServerConfig(model_path=str(engine.bundle.config.model_path), metrics=True))
    state.set_loaded(engine.bundle, engine)
    client = TestClient(create_app(state))
    body = {"prompt": [5, 17, 200, 33], "n_predict": 4, "temperature": 0}
    first = client.post("/completion", json=body).json()
    assert "llamacpp:predicted_tokens_seconds 0.0" not in client.get("/metrics").text   # the last generation's rate
    _wait(lambda: client.get("/props").json()["is_sleeping"])
    scrape = client.get("/metrics").text
    assert "llamacpp:predicted_tokens_seconds 0.0" in scrape                            # nothing since the last scrape
    for path in ("/health", "/props", "/v1/models", "/metrics", "/slots", "/lab", "/"):
        assert client.get(path).status_code == 200, path
    assert client.get("/metrics").text == scrape and engine.sleeper.is_sleeping
    assert client.post("/tokenize", json={"content": "hello"}).status_code == 200
    assert client.get("/props").json()["is_sleeping"] is False
    again = client.post("/completion", json=body).json()
    assert again["content"] == first["content"] and again["tokens_evaluated"] == first["tokens_evaluated"]
