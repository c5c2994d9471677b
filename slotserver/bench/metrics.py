"""From request records to the benchmark's numbers: pure arithmetic, as `vllm bench serve` does it.

Per successful request (times in seconds from the record, reported in ms):

- TTFT = first token chunk's arrival - request start,
- E2E latency = end of the stream - request start,
- TPOT = (E2E - TTFT) / (output tokens - 1): the mean time per token *after* the first, so
  only defined for requests with more than one output token (others add no TPOT sample),
- ITL = the gaps between consecutive token chunks (one gap per chunk, however many tokens it
  carries, as vLLM does; a request with n chunks adds n - 1 samples).

Throughputs divide by the benchmark's wall duration and count only completed requests: request
throughput = completed / duration, output = their output tokens / duration, total = their input
+ output tokens / duration. Failed requests add nothing but their count and their messages:
averaging a failure's partial timings would make a failing server look fast.

Each latency gets mean, median, population std and p99 (linear interpolation between closest
ranks, numpy's default); all are None when there is no sample.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass

from slotserver.bench.record import RequestRecord

MAX_ERRORS = 5
MAX_ERROR_KINDS = 20
PERCENTILE = 99.0


def percentile(values: list[float], p: float) -> float:
    """The p-th percentile of non-empty `values` with linear interpolation (numpy's default)."""
    if not values or not 0 <= p <= 100:
        raise ValueError("percentile needs values and 0 <= p <= 100")
    ordered = sorted(values)
    rank = p / 100 * (len(ordered) - 1)
    lo, hi = math.floor(rank), math.ceil(rank)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (rank - lo)


@dataclass(frozen=True)
class Stat:
    """Summary of one latency in milliseconds; the values are None when count is 0."""
    count: int
    mean_ms: float | None
    median_ms: float | None
    std_ms: float | None
    p99_ms: float | None


def summarize(seconds: list[float]) -> Stat:
    if not seconds:
        return Stat(0, None, None, None, None)
    ms = [s * 1000.0 for s in seconds]
    mean = sum(ms) / len(ms)
    std = math.sqrt(sum((x - mean) ** 2 for x in ms) / len(ms))
    return Stat(len(ms), mean, percentile(ms, 50.0), std, percentile(ms, PERCENTILE))


def ttft(r: RequestRecord) -> float:
    return r.chunk_times[0] - r.start


def e2e_latency(r: RequestRecord) -> float:
    return r.end - r.start


def tpot(r: RequestRecord) -> float | None:
    """Time per output token excluding the first; None with fewer than two output tokens."""
    n = r.output_tokens
    return (e2e_latency(r) - ttft(r)) / (n - 1) if n > 1 else None


def itls(r: RequestRecord) -> list[float]:
    return [b - a for a, b in zip(r.chunk_times, r.chunk_times[1:])]


@dataclass(frozen=True)
class BenchMetrics:
    completed: int
    failed: int
    duration_s: float
    total_input_tokens: int
    total_output_tokens: int
    request_throughput: float
    output_throughput: float
    total_token_throughput: float
    ttft: Stat
    tpot: Stat
    itl: Stat
    e2el: Stat
    errors: tuple[str, ...]          # the first MAX_ERRORS failure messages, by request index
    error_counts: tuple[tuple[str, int], ...]   # distinct messages with counts, most frequent first


def compute_metrics(records: list[RequestRecord], duration_s: float) -> BenchMetrics:
    if not duration_s > 0:
        raise ValueError(f"the benchmark duration must be > 0, got {duration_s}")
    ok = [r for r in records if r.success]
    failed = sorted((r for r in records if not r.success), key=lambda r: r.index)
    n_in = sum(r.input_tokens for r in ok)
    n_out = sum(r.output_tokens for r in ok)
    tpots = [t for t in map(tpot, ok) if t is not None]
    return BenchMetrics(
        completed=len(ok), failed=len(failed), duration_s=duration_s,
        total_input_tokens=n_in, total_output_tokens=n_out,
        request_throughput=len(ok) / duration_s, output_throughput=n_out / duration_s,
        total_token_throughput=(n_in + n_out) / duration_s,
        ttft=summarize([ttft(r) for r in ok]), tpot=summarize(tpots),
        itl=summarize([gap for r in ok for gap in itls(r)]),
        e2el=summarize([e2e_latency(r) for r in ok]),
        errors=tuple(r.error for r in failed[:MAX_ERRORS]),
        error_counts=tuple(Counter(r.error for r in failed).most_common(MAX_ERROR_KINDS)),
    )
