"""GET /metrics: llama-server's `llamacpp:*` metrics plus `slotserver_*`, in Prometheus text format.

The `llamacpp:*` block is written by hand with llama-server's exact names (prometheus_client would
rename a counter `x_total` to family `x`, and add `_total` to `llamacpp:n_tokens_max`), each with
its HELP and TYPE lines; token counts and times are the sums over finished requests of what their
`timings` reported, so the two always agree.

Engine-side numbers (tokens, steps, queue, KV, defrag) are read from the engine's immutable stats
snapshot at scrape time by a custom collector; nothing is copied on the hot path. Latencies are
measured here, from the arrival times of a request's events on the event loop: time to first token
(from submit) and the gaps between tokens, which is what a client actually experiences.
Every `ServerMetrics` has its own registry, so two apps in one process never share counters.
"""

from __future__ import annotations

import threading
from typing import Callable, Iterator

from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from slotserver.engine.request import FinalEvent

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class RequestTotals:
    """Sums over finished requests (prompt/generation time as the engine reports them), and the
    same sums since the last scrape (`bucket`): llama-server's throughput gauges cover only the
    requests finished between two scrapes (its `reset_bucket`), so an idle server reports 0."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.prompt_n = self.prompt_ms = self.predicted_n = self.predicted_ms = 0.0
        self.cached_n = self.n_tokens_max = 0
        self.bucket = [0.0, 0.0, 0.0, 0.0]   # prompt n, prompt ms, predicted n, predicted ms since the last scrape

    def add(self, ev: FinalEvent) -> None:
        with self._lock:
            self.prompt_n += ev.n_prompt - ev.n_cached
            self.cached_n += ev.n_cached
            self.prompt_ms += ev.prompt_ms
            self.predicted_n += ev.n_predicted
            self.predicted_ms += ev.predicted_ms
            self.n_tokens_max = max(self.n_tokens_max, ev.n_prompt + ev.n_predicted)
            for i, v in enumerate((ev.n_prompt - ev.n_cached, ev.prompt_ms, ev.n_predicted, ev.predicted_ms)):
                self.bucket[i] += v

    def take_bucket(self) -> list[float]:
        """The sums since the last scrape, and a new empty bucket."""
        with self._lock:
            bucket, self.bucket = self.bucket, [0.0, 0.0, 0.0, 0.0]
        return bucket


def llamacpp_block(s, t: RequestTotals) -> bytes:
    """llama-server's metrics, names and types as its /metrics writes them (the throughput gauges
    over the requests finished since the previous scrape, as llama-server's)."""
    pn, pms, gn, gms = t.take_bucket()
    cells = sum(x.n_ctx for x in s.slots) or 1
    used = sum(x.cells_used for x in s.slots)
    rows = [
        ("counter", "prompt_tokens_total", "Number of prompt tokens processed.", t.prompt_n),
        ("counter", "prompt_tokens_cached_total", "Number of prompt tokens taken from the cache.", t.cached_n),
        ("counter", "prompt_seconds_total", "Prompt process time", t.prompt_ms / 1000),
        ("counter", "tokens_predicted_total", "Number of generation tokens processed.", t.predicted_n),
        ("counter", "tokens_predicted_seconds_total", "Predict process time", t.predicted_ms / 1000),
        ("counter", "n_decode_total", "Total number of llama_decode() calls", s.steps),
        ("counter", "n_tokens_max", "Largest observed n_tokens.", t.n_tokens_max),
        ("counter", "spec_decode_num_draft_tokens_total", "Speculative: Total draft tokens generated",
         s.spec_draft_tokens),
        ("counter", "spec_decode_num_accepted_tokens_total", "Speculative: Total draft tokens accepted by the "
         "target model", s.spec_accepted_tokens),
        ("counter", "spec_decode_num_drafts_total", "Speculative: Total speculative decoding verification steps",
         s.spec_drafts),
        ("gauge", "prompt_tokens_seconds", "Average prompt throughput in tokens/s.", _rate(pn, pms)),
        ("gauge", "predicted_tokens_seconds", "Average generation throughput in tokens/s.", _rate(gn, gms)),
        ("gauge", "kv_cache_usage_ratio", "KV-cache usage. 1 means 100 percent usage.", used / cells),
        ("gauge", "kv_cache_tokens", "KV-cache tokens.", used),
        ("gauge", "requests_processing", "Number of requests processing.", s.n_active),
        ("gauge", "requests_deferred", "Number of requests deferred.", s.queue_len),
        # each sampled token is one step in which its slot was busy (prefill chunks aside)
        ("gauge", "n_busy_slots_per_decode", "Average number of busy slots per llama_decode() call",
         s.predicted_tokens / max(s.steps, 1)),
    ]
    lines = []
    for kind, name, doc, value in rows:
        lines += [f"# HELP llamacpp:{name} {doc}", f"# TYPE llamacpp:{name} {kind}", f"llamacpp:{name} {float(value)!r}"]
    return ("\n".join(lines) + "\n").encode()


def _rate(n: float, ms: float) -> float:
    return 1000.0 * n / ms if ms > 0 else 0.0


class EngineCollector:
    """Reads `stats()` (an EngineStats or None while loading) and the lab at scrape time."""

    def __init__(self, stats: Callable[[], object], lab: Callable[[], object], totals: RequestTotals) -> None:
        self.stats, self.lab, self.totals = stats, lab, totals

    def collect(self) -> Iterator[Metric]:
        s = self.stats()
        if s is None:
            return
        yield from (
            _counter("slotserver_prompt_tokens_computed_total", "Prompt tokens computed by the engine.",
                     s.prompt_tokens),
            _counter("slotserver_defrag_moves_total", "Sequence defragmentation moves.", s.defrag_moves),
            _counter("slotserver_defrag_bytes_total", "Bytes copied by defragmentation moves.",
                     s.defrag_bytes),
            _gauge("slotserver_kv_bytes", "Bytes of KV-cache memory in use by the layout.", s.kv_bytes),
            _counter("slotserver_requests_total", "Requests finished by the engine.", s.requests_done),
        )
        yield from self._reloads()

    def _reloads(self) -> Iterator[Metric]:
        """`slotserver_reloads_total{result}` from the lab snapshot's stats["reloads"] = {result: n}."""
        lab = self.lab()
        if lab is None:
            return
        try:
            reloads = lab.snapshot().get("stats", {}).get("reloads", {})
        except Exception:  # noqa: BLE001 - a lab in flux never breaks a scrape
            return
        if isinstance(reloads, dict) and reloads:
            family = CounterMetricFamily("slotserver_reloads_total", "Kernel/layout reloads by result.",
                                         labels=["result"])
            for result, n in sorted(reloads.items()):
                if isinstance(n, (int, float)):
                    family.add_metric([str(result)], n)
            yield family


def _counter(name: str, doc: str, value: float) -> Metric:
    return CounterMetricFamily(name, doc, value=value)


def _gauge(name: str, doc: str, value: float) -> Metric:
    return GaugeMetricFamily(name, doc, value=value)


class ServerMetrics:
    def __init__(self, stats: Callable[[], object], lab: Callable[[], object]) -> None:
        self.registry = CollectorRegistry()
        self.totals = RequestTotals()
        self.ttft = Histogram("slotserver_time_to_first_token_seconds",
                              "Time from submit to the first token.", buckets=LATENCY_BUCKETS,
                              registry=self.registry)
        self.itl = Histogram("slotserver_inter_token_latency_seconds", "Time between consecutive tokens.",
                             buckets=LATENCY_BUCKETS, registry=self.registry)
        self.registry.register(EngineCollector(stats, lab, self.totals))
        self._stats = stats

    def render(self) -> bytes:
        s = self._stats()
        head = llamacpp_block(s, self.totals) if s is not None else b""
        return head + generate_latest(self.registry)
