"""Showing a benchmark: vLLM's "Serving Benchmark Result" table, and the `--json` file.

The JSON keeps vLLM's top-level names (`completed`, `duration`, `request_throughput`,
`mean_ttft_ms`, `p99_itl_ms`...) so scripts written for `vllm bench serve` results read it, and
adds `failed`, `errors`, the full `config`, the warm-up outcome and one entry per request.
Latencies are milliseconds; a statistic without samples is null (never 0, which would read as
"instant").
"""

from __future__ import annotations

import importlib.metadata
import json
import math
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from slotserver.bench import metrics as m
from slotserver.bench.config import BenchConfig
from slotserver.bench.record import RequestRecord
from slotserver.bench.runner import BenchResult

SCHEMA = "slotserver-bench/1"
SECTIONS = (("ttft", "TTFT", "Time to First Token"),
            ("tpot", "TPOT", "Time per Output Token (excl. 1st token)"),
            ("itl", "ITL", "Inter-token Latency"),
            ("e2el", "E2EL", "End-to-end Latency"))


def _installed_version() -> str:
    """The installed package's version, from its metadata: bench imports nothing of slotserver
    outside slotserver.bench (not even `slotserver.__version__`), see tests/test_import_graph.py."""
    try:
        return importlib.metadata.version("slotserver")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"   # run from a source tree that was never installed


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1000.0


def request_json(r: RequestRecord) -> dict[str, Any]:
    ok = r.success
    return {"index": r.index, "success": ok, "error": r.error or None,
            "input_tokens": r.input_tokens if ok else None, "output_tokens": r.output_tokens if ok else 0,
            "chunks_received": len(r.chunk_times),
            "ttft_ms": _ms(m.ttft(r)) if ok else None, "tpot_ms": _ms(m.tpot(r)) if ok else None,
            "e2el_ms": _ms(m.e2e_latency(r)) if ok else None,
            "itls_ms": [g * 1000.0 for g in m.itls(r)] if ok else []}


def result_json(result: BenchResult) -> dict[str, Any]:
    cfg, mt = result.config, result.metrics
    out: dict[str, Any] = {
        "schema": SCHEMA, "date": result.started_at, "slotserver_version": _installed_version(),
        "backend": cfg.backend, "base_url": cfg.base_url, "model_id": result.model,
        "num_prompts": cfg.num_prompts, "request_rate": cfg.to_json()["request_rate"],
        "burstiness": cfg.burstiness, "max_concurrency": cfg.max_concurrency,
        "duration": mt.duration_s, "completed": mt.completed, "failed": mt.failed,
        "total_input_tokens": mt.total_input_tokens, "total_output_tokens": mt.total_output_tokens,
        "request_throughput": mt.request_throughput, "output_throughput": mt.output_throughput,
        "total_token_throughput": mt.total_token_throughput,
    }
    for key, _, _ in SECTIONS:
        stat: m.Stat = getattr(mt, key)
        for name in ("mean", "median", "std", "p99"):
            out[f"{name}_{key}_ms"] = getattr(stat, f"{name}_ms")
    warm = result.warmup
    out["errors"] = list(mt.errors)
    out["error_counts"] = dict(mt.error_counts)
    out["warmup"] = {"requests": len(warm), "completed": sum(r.success for r in warm),
                     "failed": sum(not r.success for r in warm),
                     "errors": [r.error for r in warm if not r.success][:m.MAX_ERRORS]}
    out["config"] = cfg.to_json()
    out["requests"] = [request_json(r) for r in result.records]
    return out


def write_json(result: BenchResult, path: Path) -> None:
    Path(path).write_text(json.dumps(result_json(result), indent=2) + "\n", encoding="utf-8")


def _fmt(value: float | int | str | None) -> str:
    if value is None:
        return "n/a"
    return f"{value:.2f}" if isinstance(value, float) else str(value)


def result_table(result: BenchResult) -> Table:
    cfg, mt = result.config, result.metrics
    table = Table(title="Serving Benchmark Result", show_header=False, min_width=50)
    table.add_column("metric")
    table.add_column("value", justify="right")
    rows = [("Successful requests", mt.completed), ("Failed requests", mt.failed),
            ("Maximum request concurrency", cfg.max_concurrency or "unlimited"),
            ("Benchmark duration (s)", mt.duration_s), ("Total input tokens", mt.total_input_tokens),
            ("Total generated tokens", mt.total_output_tokens),
            ("Request throughput (req/s)", mt.request_throughput),
            ("Output token throughput (tok/s)", mt.output_throughput),
            ("Total Token throughput (tok/s)", mt.total_token_throughput)]
    for label, value in rows:
        style = "bold red" if label == "Failed requests" and mt.failed else None
        table.add_row(label, _fmt(value), style=style)
    for key, short, title in SECTIONS:
        stat: m.Stat = getattr(mt, key)
        table.add_section()
        table.add_row(f"[bold]{title}[/bold]", "")
        for name in ("mean", "median", "p99"):
            table.add_row(f"{name.capitalize() if name != 'p99' else 'P99'} {short} (ms)",
                          _fmt(getattr(stat, f"{name}_ms")))
    return table


def run_header(cfg: BenchConfig) -> str:
    rate = "inf" if math.isinf(cfg.request_rate) else f"{cfg.request_rate:g} req/s"
    kind = " (Poisson process)" if cfg.burstiness == 1.0 else ""
    model = cfg.model or ("from /v1/models" if cfg.backend == "openai" else "(not sent)")
    return (f"Backend: {cfg.backend} at {cfg.base_url}, model: {model}\n"
            f"Traffic request rate: {rate}\nBurstiness factor: {cfg.burstiness:g}{kind}\n"
            f"Maximum request concurrency: {cfg.max_concurrency or 'unlimited'}")


def print_result(result: BenchResult, console: Console) -> None:
    """The table, then every way requests failed (warm-up included), never just a count."""
    mt = result.metrics
    console.print(result_table(result))
    if mt.failed:
        console.print(f"[bold red]{mt.failed} of {mt.completed + mt.failed} requests failed:[/bold red]")
        for message, count in mt.error_counts[:m.MAX_ERRORS]:
            console.print(Text(f"  {count} x {message}"))
        if len(mt.error_counts) > m.MAX_ERRORS:
            console.print(f"  ... and {len(mt.error_counts) - m.MAX_ERRORS} other messages (see --json)")
    warm_failed = [r.error for r in result.warmup if not r.success]
    if warm_failed:
        console.print(Text(f"{len(warm_failed)} of {len(result.warmup)} warm-up requests failed "
                           f"(not counted above): {warm_failed[0]}", style="yellow"))
