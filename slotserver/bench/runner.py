"""Running a benchmark: warm-up, arrivals, the concurrency limit, progress, then the metrics.

Arrivals follow `vllm bench serve`: with `--request-rate inf` every request is released at once;
otherwise the gaps between releases are drawn from a gamma distribution with shape
`burstiness` and mean 1/rate (burstiness 1 is a Poisson process; below 1 burstier, above 1 more
regular), seeded by `--seed`. A released request then waits for one of the `--max-concurrency`
slots, and its clock starts only when it is actually sent, so TTFT measures the server and not
the benchmark's own queue.

Warm-up requests (`--warmup N`) go first, all at once under the same concurrency limit, and are
not part of any metric; their failures are kept and reported separately. The benchmark's
duration runs from releasing the first measured request to the end of the last one.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import random
import sys
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Callable, Iterator

import httpx

from slotserver.bench.client import send_request
from slotserver.bench.config import BenchConfig
from slotserver.bench.dataset import Prompt, build_prompts
from slotserver.bench.metrics import BenchMetrics, compute_metrics
from slotserver.bench.record import RequestRecord
from slotserver.bench.server_info import resolve


@dataclass(frozen=True)
class BenchResult:
    config: BenchConfig
    model: str | None                # the model name sent (openai) or reported by the server
    started_at: str                  # ISO 8601, UTC
    metrics: BenchMetrics
    records: list[RequestRecord]     # the measured requests, by index
    warmup: list[RequestRecord]      # not counted anywhere in `metrics`


def arrival_offsets(n: int, rate: float, burstiness: float, seed: int) -> list[float]:
    """Release times in seconds after the start: the first at 0, then gamma-distributed gaps."""
    if math.isinf(rate):
        return [0.0] * n
    rng = random.Random(f"{seed}/arrivals")
    scale = 1.0 / (rate * burstiness)           # gamma mean = shape * scale = 1 / rate
    offsets, t = [], 0.0
    for _ in range(n):
        offsets.append(t)
        t += rng.gammavariate(burstiness, scale)
    return offsets


async def run_requests(http: httpx.AsyncClient, cfg: BenchConfig, prompts: list[Prompt],
                       offsets: list[float], model: str | None,
                       on_done: Callable[[RequestRecord], None] = lambda r: None) -> list[RequestRecord]:
    """Send `prompts[i]` at `offsets[i]` under the concurrency limit; records in prompt order."""
    limit = asyncio.Semaphore(cfg.max_concurrency) if cfg.max_concurrency else None
    t0 = time.perf_counter()

    async def one(index: int, prompt: Prompt, offset: float) -> RequestRecord:
        delay = t0 + offset - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        async with limit or contextlib.nullcontext():
            record = await send_request(http, cfg, prompt, index, model)
        on_done(record)
        return record

    return list(await asyncio.gather(*(one(i, p, o) for i, (p, o) in enumerate(zip(prompts, offsets)))))


@contextlib.contextmanager
def progress_bar(total: int, enabled: bool) -> Iterator[Callable[[RequestRecord], None]]:
    """A rich progress bar on stderr (only on a terminal); yields the per-request callback."""
    if not enabled or not sys.stderr.isatty():
        yield lambda record: None
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    failed = 0
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task("benchmark", total=total)

        def tick(record: RequestRecord) -> None:
            nonlocal failed
            failed += not record.success
            bar.update(task, advance=1, description=f"benchmark ({failed} failed)" if failed else "benchmark")

        yield tick


def http_client(cfg: BenchConfig, transport: httpx.AsyncBaseTransport | None) -> httpx.AsyncClient:
    """No connection cap: the benchmark's own semaphore is the only concurrency limit."""
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    return httpx.AsyncClient(transport=transport, timeout=httpx.Timeout(cfg.timeout_s), limits=limits)


async def run_benchmark(cfg: BenchConfig,
                        transport: httpx.AsyncBaseTransport | None = None) -> BenchResult:
    """The whole benchmark; `transport` lets tests talk to a fake server. Raises BenchError or
    ConfigError only before the first request (no vocabulary size, a bad dataset file)."""
    async with http_client(cfg, transport) as http:
        info = await resolve(http, cfg)
        prompts = build_prompts(cfg.num_prompts + cfg.warmup, cfg.input_len, cfg.seed,
                                info.n_vocab, cfg.dataset)
        measured, warm = prompts[:cfg.num_prompts], prompts[cfg.num_prompts:]
        warm_records = await run_requests(http, cfg, warm, [0.0] * len(warm), info.model)
        offsets = arrival_offsets(len(measured), cfg.request_rate, cfg.burstiness, cfg.seed)
        started_at = datetime.now(timezone.utc).isoformat(timespec="seconds")
        with progress_bar(len(measured), cfg.progress) as tick:
            t0 = time.perf_counter()
            records = await run_requests(http, cfg, measured, offsets, info.model, tick)
            duration = time.perf_counter() - t0
    return BenchResult(cfg, info.model, started_at, compute_metrics(records, duration),
                       records, warm_records)
