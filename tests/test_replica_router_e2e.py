"""`slotserver router` in front of two real slotserver apps (tiny engines, in-process, real ports):
what the router's affinity buys, as the replicas themselves report it."""

from __future__ import annotations

import contextlib

import httpx
import pytest

from replica_stubs import Serving
from slotserver.replicas.app import Router
from slotserver.replicas.config import RouterConfig
from slotserver.server import ServerConfig, ServerState, create_app
from tiny_engine import running_tiny_engine


@pytest.fixture(scope="module")
def routed(tmp_path_factory):
    """(router client, {replica name: its own client})."""
    with contextlib.ExitStack() as stack:
        replicas = []
        for i in range(2):
            bundle, engine = stack.enter_context(running_tiny_engine(tmp_path_factory.mktemp(f"r{i}"), 2, 1024,
                                                                   ctx_len=1024))
            state = ServerState(ServerConfig(model_path=str(bundle.config.model_path), metrics=True))
            state.set_loaded(bundle, engine)
            replicas.append(Serving(create_app(state)))
            stack.callback(replicas[-1].stop)
        front = Serving(Router(RouterConfig(upstreams=tuple(r.url for r in replicas), health_interval=0.2)).app)
        stack.callback(front.stop)
        own = {r.url.removeprefix("http://"): stack.enter_context(httpx.Client(base_url=r.url)) for r in replicas}
        yield stack.enter_context(httpx.Client(base_url=front.url, timeout=30)), own


def test_a_conversation_finds_its_history_in_its_replica_cache(routed):
    client, _ = routed
    msgs = [{"role": "system", "content": "You answer questions about the build. " * 3},
            {"role": "user", "content": "why does the build fail?"}]
    served, previous = set(), 0
    for turn in range(3):
        r = client.post("/v1/chat/completions", json={"messages": msgs, "max_tokens": 3, "temperature": 0})
        assert r.status_code == 200, r.text
        served.add(r.headers["x-slotserver-replica"])
        t = r.json()["timings"]
        assert t["cache_n"] >= previous   # the whole previous prompt came from the cache
        previous = t["cache_n"] + t["prompt_n"]
        msgs += [r.json()["choices"][0]["message"], {"role": "user", "content": f"and step {turn}?"}]
    assert len(served) == 1 and previous > 0


def test_streams_and_metrics_of_real_replicas(routed):
    client, own = routed
    with client.stream("POST", "/completion", json={"prompt": "hello", "n_predict": 3, "stream": True}) as r:
        events = [line for line in r.iter_lines() if line.startswith("data: ")]
    assert len(events) >= 3 and '"stop":true' in events[-1].replace(" ", "")
    fleet = client.get("/metrics").text.splitlines()

    def value(lines, name):
        return float(next(x for x in lines if x.startswith(name + " ")).split()[-1])

    total = sum(value(c.get("/metrics").text.splitlines(), "llamacpp:prompt_tokens_total") for c in own.values())
    assert total > 0 and value(fleet, "llamacpp:prompt_tokens_total") == total
    assert sum(x.startswith("llamacpp:kv_cache_tokens{replica=") for x in fleet) == 2
