"""The server's host work per streamed token: CPU microseconds of the server process per generated
token, tok/s and the median inter-token time, at several concurrencies (issue 34's "HTTP path").

With a model whose forward is nearly free (the tiny fixtures under tests/fixtures/archs/, one
thread), what the server process burns per token is its per-token host work: the engine's
postprocess, detokenization, stop checks, the engine -> asyncio hand-off, SSE chunks and JSON,
uvicorn's writes. CPU seconds from /proc are robust on a shared host where wall times are not.
On a GPU (`--serve-args "--device cuda"`, a real model) the same numbers say how much of an
inter-token gap is the server's own.

    .venv/bin/python playground/http_overhead.py                       # tiny qwen3, c = 1 8 32 64
    .venv/bin/python playground/http_overhead.py --tree /tmp/base --tree .   # A/B, interleaved
    .venv/bin/python playground/http_overhead.py -m model.gguf --serve-args "--device cuda"

Each `--tree` is a source tree whose `slotserver` the server runs (PYTHONPATH); with several, the
measurements alternate between them, one (endpoint, concurrency) cell at a time, `--rounds` times.
A tree may carry environment settings for its server: `--tree .:SLOTSERVER_LOOP=asyncio --tree .`
compares asyncio's event loop with the default uvloop on one tree.
The client is a bare asyncio HTTP/1.1 reader (no httpx, no JSON per event) so that it takes as
little of the shared cores as it can; its own CPU is printed too.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from local_server import free_port, wait_healthy  # noqa: E402
from http_overhead_client import StreamResult, stream  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
MIN_REQUESTS = 8   # per cell, so that c=1 measures more than a couple of requests


@dataclass(frozen=True)
class Config:
    model: str
    trees: tuple[str, ...]
    concurrency: tuple[int, ...]
    endpoints: tuple[str, ...]
    tokens: int
    rounds: int
    requests_per_stream: int
    seed: int
    temperature: float
    serve_args: tuple[str, ...]
    threads: int
    json_out: str | None

    def __post_init__(self) -> None:
        if not self.trees or not self.concurrency or self.tokens < 2 or self.rounds < 1:
            raise ValueError("need a tree, a concurrency, --tokens >= 2 and --rounds >= 1")
        for e in self.endpoints:
            if e not in ("chat", "completion"):
                raise ValueError(f"unknown endpoint {e!r}: chat or completion")


@dataclass
class Server:
    tree: str
    port: int
    proc: subprocess.Popen

    def cpu(self) -> dict[str, float]:
        """CPU seconds of each of the process's threads, by thread id (the main one runs the event
        loop). From schedstat (nanoseconds): /proc's utime and stime count 10 ms ticks."""
        out = {}
        for tid in os.listdir(f"/proc/{self.proc.pid}/task"):
            try:
                with open(f"/proc/{self.proc.pid}/task/{tid}/schedstat") as f:
                    out[tid] = int(f.read().split()[0]) / 1e9
            except OSError:   # the thread ended meanwhile
                pass
        return out


def tree_env(spec: str) -> tuple[str, dict[str, str]]:
    """`PATH[:NAME=VALUE[,NAME=VALUE...]]` -> (PATH, its server's extra environment)."""
    path, _, env = spec.partition(":") if "=" in spec else (spec, "", "")
    return path, dict(kv.split("=", 1) for kv in env.split(",") if kv)


def start_server(cfg: Config, spec: str) -> Server:
    tree, extra = tree_env(spec)
    port = free_port()
    n_ctx = max(cfg.concurrency) * max(256, cfg.tokens + 64)
    cmd = [sys.executable, "-m", "slotserver.cli.main", "serve", "-m", cfg.model, "--port", str(port),
           "-np", str(max(cfg.concurrency)), "-c", str(n_ctx), "-t", str(cfg.threads), "--no-watch",
           *cfg.serve_args]
    env = {**os.environ, **extra, "PYTHONPATH": str(Path(tree).resolve())}
    # its log goes to a file: a pipe nobody reads fills up (an access line per request) and then
    # blocks the server's event loop in the middle of a run
    log = tempfile.NamedTemporaryFile("wb", prefix="http_overhead_", suffix=".log", delete=False)
    proc = subprocess.Popen(cmd, env=env, cwd=tree, stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_healthy(port, f"slotserver from {tree} (log: {log.name})", proc)
    finally:
        log.close()
    return Server(spec, port, proc)


def body(cfg: Config, endpoint: str, i: int) -> dict:
    """A short distinct prompt per request (prefill stays negligible), a fixed length of output."""
    prompt = f"Request {i}: write a long story about the number {i * 7919 % 1000}."
    common = {"stream": True, "ignore_eos": True, "seed": cfg.seed + i, "temperature": cfg.temperature}
    if endpoint == "chat":
        return {**common, "messages": [{"role": "user", "content": prompt}], "max_tokens": cfg.tokens}
    return {**common, "prompt": prompt, "n_predict": cfg.tokens}


async def load(cfg: Config, server: Server, endpoint: str, c: int) -> list[StreamResult]:
    path = "/v1/chat/completions" if endpoint == "chat" else "/completion"
    counter = iter(range(max(c * cfg.requests_per_stream, MIN_REQUESTS)))
    out: list[StreamResult] = []

    async def worker() -> None:
        for i in counter:
            out.append(await stream("127.0.0.1", server.port, path, body(cfg, endpoint, i)))

    await asyncio.gather(*(worker() for _ in range(c)))
    return out


def engine_timings(port: int) -> tuple[int, float]:
    """(steps so far, total forward ms so far) from the engine's stats on /lab."""
    import urllib.request
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/lab", timeout=10) as r:
        eng = json.loads(r.read())["engine"]
    return eng["steps"], eng["steps"] * eng["timings"]["forward"]


@dataclass
class Cell:
    tree: str
    endpoint: str
    c: int
    tokens: int = 0
    wall_s: float = 0.0
    cpu_us_per_token: float = 0.0
    loop_us_per_token: float = 0.0
    busiest_other_us_per_token: float = 0.0
    client_us_per_token: float = 0.0
    itl_ms_p50: float = 0.0           # between the client's reads of a stream's chunks (a lagging client reads ~0)
    tpot_ms_p50: float = 0.0          # the server's predicted_per_token_ms, median over requests
    forward_ms_per_step: float = 0.0
    steps: int = 0

    @property
    def tok_s(self) -> float:
        return self.tokens / self.wall_s if self.wall_s else 0.0


def measure(cfg: Config, server: Server, endpoint: str, c: int) -> Cell:
    steps0, fwd0 = engine_timings(server.port)
    cpu0, client0, t0 = server.cpu(), time.process_time(), time.perf_counter()
    results = asyncio.run(load(cfg, server, endpoint, c))
    wall, client1, cpu1 = time.perf_counter() - t0, time.process_time(), server.cpu()
    steps1, fwd1 = engine_timings(server.port)
    bad = [r for r in results if r.n_tokens != cfg.tokens]
    if bad:
        raise RuntimeError(f"{len(bad)} streams did not generate {cfg.tokens} tokens: {bad[0]}")
    n = sum(r.n_tokens for r in results)
    used = {t: cpu1[t] - cpu0.get(t, 0.0) for t in cpu1}
    loop = used.pop(str(server.proc.pid), 0.0)
    gaps = [g for r in results for g in r.gaps_s]
    return Cell(server.tree, endpoint, c, n, wall, 1e6 * (loop + sum(used.values())) / n,
                1e6 * loop / n, 1e6 * max(used.values(), default=0.0) / n,
                1e6 * (client1 - client0) / n, 1e3 * statistics.median(gaps) if gaps else 0.0,
                statistics.median(r.tpot_ms for r in results),
                (fwd1 - fwd0) / max(steps1 - steps0, 1), steps1 - steps0)


def warm_up(cfg: Config, server: Server) -> None:
    """One short request per endpoint, not measured: first-use costs (C kernels, templates)."""
    for endpoint in cfg.endpoints:
        asyncio.run(load(Config(**{**cfg.__dict__, "tokens": 4, "requests_per_stream": 1}), server, endpoint, 1))


def run(cfg: Config) -> list[Cell]:
    servers = [start_server(cfg, tree) for tree in cfg.trees]
    cells: list[Cell] = []
    try:
        for server in servers:
            warm_up(cfg, server)
        for r in range(cfg.rounds):
            for endpoint in cfg.endpoints:
                for c in cfg.concurrency:
                    order = servers if r % 2 == 0 else servers[::-1]   # neither tree always goes first
                    for server in order:
                        cell = measure(cfg, server, endpoint, c)
                        cells.append(cell)
                        print(line(cell), flush=True)
    finally:
        for server in servers:
            server.proc.terminate()
            server.proc.wait(timeout=30)
    return cells


def line(cell: Cell) -> str:
    return (f"{cell.tree:<16} {cell.endpoint:<10} c={cell.c:<3} {cell.tok_s:7.0f} tok/s  tpot p50 "
            f"{cell.tpot_ms_p50:5.2f} ms  itl p50 {cell.itl_ms_p50:5.2f} ms  server {cell.cpu_us_per_token:6.1f} us/tok (loop "
            f"{cell.loop_us_per_token:5.1f}, busiest other thread {cell.busiest_other_us_per_token:5.1f})  "
            f"client {cell.client_us_per_token:5.1f} us/tok  forward {cell.forward_ms_per_step:5.2f} ms/step "
            f"x {cell.steps}")


def summary(cells: list[Cell]) -> str:
    """Per tree, endpoint and concurrency: the range over rounds of each number."""
    out = ["", "summary (min-max over rounds): server CPU us/token | event loop us/token | tok/s | tpot p50 ms"]
    keys = sorted({(c.endpoint, c.c, c.tree) for c in cells}, key=lambda k: (k[0], k[1]))
    for endpoint, conc, tree in keys:
        group = [c for c in cells if (c.endpoint, c.c, c.tree) == (endpoint, conc, tree)]

        def rng(f) -> str:
            vals = [f(c) for c in group]
            return f"{min(vals):.1f}-{max(vals):.1f}"
        out.append(f"{endpoint:<10} c={conc:<3} {tree:<16} {rng(lambda c: c.cpu_us_per_token):>13} | "
                   f"{rng(lambda c: c.loop_us_per_token):>11} | {rng(lambda c: c.tok_s):>13} | "
                   f"{rng(lambda c: c.tpot_ms_p50):>9}")
    return "\n".join(out)


def parse_args(argv: list[str] | None = None) -> Config:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("-m", "--model", default=str(ROOT / "tests/fixtures/archs/qwen3.gguf"))
    p.add_argument("--tree", action="append", help="source tree to serve from (repeat for an A/B; default: this one)")
    p.add_argument("--concurrency", default="1,8,32,64")
    p.add_argument("--endpoints", default="chat,completion")
    p.add_argument("--tokens", type=int, default=128, help="generated tokens per request (ignore_eos)")
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--requests-per-stream", type=int, default=2, help="requests each concurrent client sends in turn")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--temperature", type=float, default=0.0, help="0: greedy, as `slotserver bench`")
    p.add_argument("-t", "--threads", type=int, default=1, help="the server's torch threads (1: no OpenMP spin in the CPU numbers)")
    p.add_argument("--serve-args", default="", help="more `slotserver serve` flags, one string")
    p.add_argument("--json", dest="json_out", help="write every cell here")
    a = p.parse_args(argv)
    return Config(a.model, tuple(a.tree or [str(ROOT)]), tuple(int(x) for x in a.concurrency.split(",")),
                  tuple(a.endpoints.split(",")), a.tokens, a.rounds, a.requests_per_stream, a.seed,
                  a.temperature, tuple(a.serve_args.split()), a.threads, a.json_out)


def main(argv: list[str] | None = None) -> None:
    cfg = parse_args(argv)
    print(f"model {cfg.model}, {cfg.tokens} tokens a request, {cfg.requests_per_stream} requests a stream, "
          f"threads {cfg.threads}, CPU flags: {cpu_flags()}", flush=True)
    cells = run(cfg)
    print(summary(cells))
    if cfg.json_out:
        Path(cfg.json_out).write_text(json.dumps([{**c.__dict__, "tok_s": c.tok_s} for c in cells], indent=1))


def cpu_flags() -> str:
    wanted = ("amx_bf16", "amx_int8", "avx512_bf16", "avx512_vnni", "avx512f", "avx2")
    try:
        flags = set(Path("/proc/cpuinfo").read_text().split("flags", 2)[1].split("\n", 1)[0].split())
    except (OSError, IndexError):
        return "unknown"
    return " ".join(f for f in wanted if f in flags) or "none of " + " ".join(wanted)


if __name__ == "__main__":
    main()
