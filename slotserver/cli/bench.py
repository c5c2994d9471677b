"""`slotserver bench`: measure a running server the way `vllm bench serve` does.

Exit status: 0 when at least one request completed (failures, if any, are in the table and the
JSON); 1 when every request failed or the benchmark could not start (server unreachable,
vocabulary size unknown); 2 for a bad flag or dataset file (one line on stderr).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path


def add_parser(sub) -> None:
    p = sub.add_parser("bench", help="benchmark a running server (vllm bench serve's metrics)",
                       description=__doc__.splitlines()[0])
    a = p.add_argument
    a("--base-url", default="http://127.0.0.1:8080", help="server address (default %(default)s)")
    a("--backend", choices=["openai", "llama"], default="openai",
      help="openai: POST /v1/completions; llama: POST /completion (default openai)")
    a("--model", default=None, help="model name for the OpenAI 'model' field (default: /v1/models)")
    a("--input-len", type=int, default=128, help="tokens per random prompt (default 128)")
    a("--output-len", type=int, default=64, help="tokens generated per request (default 64)")
    a("--num-prompts", type=int, default=32, help="measured requests (default 32)")
    a("--max-concurrency", type=int, default=None, help="requests in flight at most (default: no limit)")
    a("--request-rate", type=float, default=float("inf"),
      help="requests per second; inf sends all at once (default inf)")
    a("--burstiness", type=float, default=1.0,
      help="gamma shape of arrival gaps: 1 Poisson, <1 burstier, >1 steadier (default 1)")
    a("--seed", type=int, default=0)
    a("--warmup", type=int, default=0, help="requests sent first and not measured (default 0)")
    a("--temperature", type=float, default=0.0, help="sampling temperature (default 0: greedy)")
    a("--dataset", type=Path, default=None, help="JSON list of prompt strings instead of random ids")
    a("--vocab-size", type=int, default=None, help="vocabulary size for random ids (default: /v1/models)")
    a("--api-key", default=None, help="sent as 'Authorization: Bearer KEY'")
    a("--timeout", type=float, default=600.0, help="per-request timeout in seconds (default 600)")
    a("--json", type=Path, default=None, metavar="FILE", help="write every metric and the config here")
    a("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(run=run)


def config_from_args(args: argparse.Namespace):
    from slotserver.bench.config import BenchConfig

    return BenchConfig(
        base_url=args.base_url, backend=args.backend, model=args.model, input_len=args.input_len,
        output_len=args.output_len, num_prompts=args.num_prompts, max_concurrency=args.max_concurrency,
        request_rate=args.request_rate, burstiness=args.burstiness, seed=args.seed, warmup=args.warmup,
        temperature=args.temperature, dataset=args.dataset, vocab_size=args.vocab_size,
        api_key=args.api_key, timeout_s=args.timeout, json_path=args.json, progress=not args.no_progress)


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    from slotserver.bench.config import ConfigError
    from slotserver.bench.report import print_result, run_header, write_json
    from slotserver.bench.runner import run_benchmark
    from slotserver.bench.server_info import BenchError

    err = Console(stderr=True, highlight=False)
    try:
        cfg = config_from_args(args)
        err.print(run_header(cfg), markup=False)
        result = asyncio.run(run_benchmark(cfg))
    except ConfigError as e:
        print(f"slotserver bench: error: {e}", file=sys.stderr)
        return 2
    except BenchError as e:
        print(f"slotserver bench: error: {e}", file=sys.stderr)
        return 1
    print_result(result, Console())
    if cfg.json_path is not None:
        write_json(result, cfg.json_path)
        err.print(f"results written to {cfg.json_path}", markup=False)
    if result.metrics.completed == 0:
        print(f"slotserver bench: error: all {result.metrics.failed} requests failed", file=sys.stderr)
        return 1
    return 0
