"""`slotserver router`: the replica router, tested through HTTP against stub replicas on real ports.

The stubs (tests/replica_stubs.py) record what reached them, so each test checks what the router
did to real HTTP traffic: where it sent each turn of a conversation, what happened when a replica
was down or died, whether chunks came through one by one, whether a client's disconnect reached
the replica, and what /metrics shows.
"""

from __future__ import annotations

import contextlib
import json
import time

import httpx
import pytest

from replica_stubs import BlackHole, Serving, StubReplica, free_port
from slotserver.replicas.app import Router
from slotserver.replicas.config import RouterConfig

SYSTEM = "You are a coding agent. Use the tools to answer. " * 4


@contextlib.contextmanager
def fleet(n: int, extra_urls: tuple[str, ...] = (), **config):
    """n stub replicas (+ other upstream URLs) behind a router; yields (router client, stubs, router)."""
    stubs = [StubReplica(f"r{i}", counter=10.0 * (i + 1)) for i in range(n)]
    servers = [Serving(s.app()) for s in stubs]
    cfg = RouterConfig(upstreams=tuple(s.url for s in servers) + extra_urls, health_interval=0.2, **config)
    router = Router(cfg)
    front = Serving(router.app)
    client = httpx.Client(base_url=front.url, timeout=10)
    try:
        yield client, stubs, router, servers
    finally:
        client.close()
        front.stop()
        for s in servers:
            s.stop()


def owner(stubs: list[StubReplica], marker: str) -> set[str]:
    """Which stubs received a request whose first user message is `marker`."""
    return {s.name for s in stubs for seen in s.seen if seen.body.get("messages", [{}, {}])[1].get("content") == marker}


def test_turns_of_a_conversation_stay_on_one_replica():
    with fleet(3) as (client, stubs, router, _):
        convs = {f"task {i}: fix bug #{i * 7919}": [] for i in range(6)}
        for turn in range(4):
            for first, history in convs.items():
                msgs = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": first}] + history
                r = client.post("/v1/chat/completions", json={"messages": msgs, "max_tokens": 4})
                assert r.status_code == 200, r.text
                history += [{"role": "assistant", "content": r.json()["content"]},
                            {"role": "user", "content": f"turn {turn} result"}]
        for first in convs:
            assert len(owner(stubs, first)) == 1, f"{first!r} was spread over {owner(stubs, first)}"
        stats = client.get("/router/replicas").json()
        assert stats["routed"]["prefix_hit"] >= 6 * 3   # every turn after the first found its prefix
        assert sum(len(s.seen) for s in stubs) == 24


def test_round_robin_policy_spreads_a_conversation():
    """The baseline the benchmark compares to: the same turns go everywhere."""
    with fleet(3, policy="round-robin") as (client, stubs, _, _):
        msgs = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "one task"}]
        for _ in range(6):
            assert client.post("/v1/chat/completions", json={"messages": msgs}).status_code == 200
        assert [len(s.seen) for s in stubs] == [2, 2, 2]


def test_a_replica_that_is_down_is_skipped_and_its_conversations_move():
    dead_url = f"http://127.0.0.1:{free_port()}"   # nothing listens there
    with fleet(2, extra_urls=(dead_url,)) as (client, stubs, router, servers):
        assert client.get("/health").json()["replicas_healthy"] == 2
        msgs = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "long task"}]
        r = client.post("/v1/chat/completions", json={"messages": msgs})
        first = r.json()["replica"]
        servers[int(first[1])].stop()                       # the replica holding the conversation dies
        for i in range(3):
            msgs += [{"role": "assistant", "content": "ok"}, {"role": "user", "content": f"next {i}"}]
            r = client.post("/v1/chat/completions", json={"messages": msgs})
            assert r.status_code == 200 and r.json()["replica"] != first
        replicas = {x["url"]: x for x in client.get("/router/replicas").json()["replicas"]}
        assert not replicas[dead_url]["healthy"] and not replicas[servers[int(first[1])].url]["healthy"]


def test_no_healthy_replica_is_a_503():
    with fleet(1) as (client, stubs, _, _):
        stubs[0].healthy = False
        deadline = time.monotonic() + 5
        while client.get("/health").status_code != 503 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert client.get("/health").status_code == 503
        r = client.post("/completion", json={"prompt": "hi"})
        assert r.status_code == 503 and "no replica" in r.json()["error"]["message"]


def test_a_replica_dying_before_streaming_is_retried_elsewhere():
    hole = BlackHole()
    try:
        with fleet(1, extra_urls=(hole.url,), policy="round-robin") as (client, stubs, _, _):
            for i in range(4):
                r = client.post("/completion", json={"prompt": f"p{i}", "stream": True})
                assert r.status_code == 200 and "r0-0" in r.text
            assert hole.swallowed >= 1                      # it was tried, and the client never saw it
            assert client.get("/router/replicas").json()["retries"] == hole.swallowed
    finally:
        hole.close()


def test_a_503_answer_is_retried_elsewhere_unless_no_replica_is_left():
    with fleet(2, policy="round-robin") as (client, stubs, _, _):
        stubs[0].busy = True
        for i in range(4):
            r = client.post("/completion", json={"prompt": f"p{i}"})
            assert r.status_code == 200 and r.json()["replica"] == "r1"
        assert stubs[0].seen and client.get("/router/replicas").json()["retries"] == len(stubs[0].seen)
        stubs[1].busy = True
        r = client.post("/completion", json={"prompt": "last"})
        assert r.status_code == 503 and r.json()["error"]["message"] == "queue full"   # the replica's own answer


def test_no_retry_once_streaming_started():
    with fleet(2) as (client, stubs, _, _):
        got = []
        with pytest.raises(httpx.HTTPError):
            with client.stream("POST", "/completion", json={"prompt": "x", "stream": True, "stub_chunks": 5,
                                                             "stub_break_after": 2}) as r:
                for line in r.iter_lines():
                    got.append(line)
        assert [json.loads(x[6:])["content"][-1] for x in got if x.startswith("data: ")] == ["0", "1"]
        assert sum(len(s.seen) for s in stubs) == 1        # not sent again: the client had part of an answer


def test_stream_passes_through_chunk_by_chunk():
    with fleet(2) as (client, _, _, _):
        t0, arrivals = time.monotonic(), []
        with client.stream("POST", "/completion", json={"prompt": "x", "stream": True, "stub_chunks": 4,
                                                         "stub_gap": 0.3}) as r:
            for line in r.iter_lines():
                if line.startswith("data: "):
                    arrivals.append(time.monotonic() - t0)
        gaps = sorted(b - a for a, b in zip(arrivals, arrivals[1:]))
        assert len(arrivals) == 4 and gaps[1] > 0.15   # sent 0.3 s apart: one by one, none held for the next


def test_client_disconnect_closes_the_upstream_request():
    with fleet(2) as (client, stubs, _, _):
        with client.stream("POST", "/completion", json={"prompt": "x", "stream": True, "stub_chunks": 200,
                                                         "stub_gap": 0.05}) as r:
            lines = r.iter_lines()
            assert next(lines).startswith("data: ")
        seen = next(s for stub in stubs for s in stub.seen)
        deadline = time.monotonic() + 5
        while not seen.client_left and time.monotonic() < deadline:
            time.sleep(0.05)
        assert seen.client_left and not seen.finished and seen.chunks_sent < 150


def test_metrics_sum_counters_and_label_gauges():
    with fleet(3) as (client, stubs, _, _):
        for i in range(3):
            client.post("/completion", json={"prompt": "same prompt " * 20})
        text = client.get("/metrics").text
        lines = set(text.splitlines())
        assert "llamacpp:prompt_tokens_total 60.0" in lines          # 10 + 20 + 30
        assert "# TYPE llamacpp:prompt_tokens_total counter" in lines
        for stub, port in ((s, None) for s in stubs):
            assert any(x.startswith("llamacpp:kv_cache_usage_ratio{replica=") and x.endswith(f" {stub.counter / 1000}")
                       for x in lines)
        assert 'slotserver_ttft_seconds_bucket{le="+Inf"} 6.0' in lines and "slotserver_ttft_seconds_count 6.0" in lines
        assert not any("_created" in x for x in lines)
        hits = [x for x in lines
                if x.startswith("slotserver_replica_router_requests_total{") and 'reason="prefix_hit"' in x]
        assert sum(float(x.split()[-1]) for x in hits) == 2             # the 2nd and 3rd found the 1st's prefix


def test_models_and_other_paths_are_forwarded():
    with fleet(2) as (client, _, _, _):
        assert client.get("/v1/models").json()["data"][0]["id"] == "stub"
        assert client.get("/no/such/path").status_code == 404        # the replica's answer, passed on


def test_lora_scales_are_set_on_every_replica():
    with fleet(3) as (client, stubs, _, _):
        assert client.post("/lora-adapters", json=[{"id": 0, "scale": 0.25}]).json() == {"success": True}
        assert [s.lora_scale for s in stubs] == [0.25] * 3
        r = client.post("/lora-adapters", json=[{"id": 7, "scale": 1.0}])
        assert r.status_code == 400 and "no such LoRA adapter" in r.text and [s.lora_scale for s in stubs] == [0.25] * 3
        assert client.get("/lora-adapters").json() == [{"id": 0, "scale": 0.25}]   # GET: any one replica


def test_upstreams_file_is_reread(tmp_path):
    stubs = [StubReplica("a"), StubReplica("b")]
    servers = [Serving(s.app()) for s in stubs]
    path = tmp_path / "upstreams.txt"
    path.write_text(f"# the fleet\n{servers[0].url}\n")
    router = Router(RouterConfig(upstreams_file=path, health_interval=0.1))
    front = Serving(router.app)
    try:
        with httpx.Client(base_url=front.url) as client:
            assert client.get("/health").json()["replicas"] == 1
            time.sleep(0.05)
            path.write_text(f"{servers[0].url}\n{servers[1].url}  # added\n")
            deadline = time.monotonic() + 3
            while client.get("/health").json()["replicas_healthy"] < 2 and time.monotonic() < deadline:
                time.sleep(0.05)
            assert client.get("/health").json()["replicas_healthy"] == 2
    finally:
        front.stop()
        for s in servers:
            s.stop()
