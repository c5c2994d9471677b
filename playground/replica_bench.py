"""Issue 39's replica benchmark: 3 local slotserver replicas behind `slotserver router`, an agent
workload, the prefix-aware policy vs round-robin, and a replica killed mid-run.

Workload: 12 agent conversations of 8 turns, all running at once (more conversations than the
fleet's 6 slots); every conversation starts with the same ~300-token agent system prompt and its
own task, and each turn appends a tool result (~100 words of log-like text) and re-sends the whole
history to /v1/chat/completions (streamed, greedy, --n-predict tokens), as an agent framework does.

Hit rate is what the replicas themselves report: the sum of `timings.cache_n` (prompt tokens taken
from a cache: slot KV or the RAM prompt cache) over the sum of cache_n + prompt_n (computed), over
every request. Each turn's new tool output can never be cached, so that rate has a ceiling below
100% (~83% here); "history" is the share of what each turn re-sends (the previous turn's prompt
and answer) that was taken from a cache: 100% is a perfect router. Each policy gets freshly
started replicas (empty caches); the same conversations, tool outputs and greedy answers are sent
under both.

"Affinity" is the router's hit rate as issue 39 counts it: the share of turns 2..n served by the
replica that served the conversation's previous turn (~1/3 for round-robin over 3 replicas).

Kill phase: the prefix policy again, on fresh replicas, and replica 0 is SIGKILLed once a third of
the requests are done. A request that fails is classified by what its client had received: nothing
(lost before streaming: the router must have retried it, so this must stay 0) or part of an
answer (cut mid-stream: the router may not retry that; the agent re-sends the turn, counted).

    .venv/bin/python playground/replica_bench.py [--replicas 3] [--np 2] [--conversations 12] [--turns 8]
        [--threads 1] [--n-predict 16] [--replica-flags "--cache-ram 0"] [--skip-kill]
        [--policies round-robin,prefix]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shlex
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from agent_loop import tool_output  # noqa: E402  (the issue 37 benchmark's log-like text)
from local_server import free_port, wait_healthy  # noqa: E402

PY = [sys.executable, "-m", "slotserver.cli.main"]
SYSTEM = ("You are a software agent working in a large Python repository. You can call these tools: "
          "read_file(path), write_file(path, text), run_tests(pattern), grep(pattern, path), list_dir(path). "
          "Rules: read before you write; run the tests after every change; keep changes minimal; explain "
          "each step in one short sentence, then name the next tool call as JSON on its own line. ") * 3


@dataclass
class Run:
    policy: str
    cached: int = 0
    computed: int = 0
    history: int = 0           # tokens of each turn's re-sent history: the previous turn's prompt + answer
    history_reused: int = 0    # of those, taken from a cache (min(cache_n, history) per turn)
    requests: int = 0
    later_turns: int = 0       # requests of turns 2..n
    same_replica: int = 0      # of those, served by the replica that served the conversation's previous turn
    lost_before_stream: int = 0
    cut_mid_stream: int = 0
    by_replica: dict = field(default_factory=dict)
    wall_s: float = 0.0
    cpu_s: float = 0.0         # CPU seconds the replicas used for the workload (less sensitive to other jobs
                               # than wall time; in the kill run, the killed replica's share is missing)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def hit_rate(self) -> float:
        return self.cached / max(1, self.cached + self.computed)

    def history_rate(self) -> float:
        return self.history_reused / max(1, self.history)

    def affinity_rate(self) -> float:
        """The router's hit rate as the issue counts it: the share of later turns that reached the
        replica holding the conversation's history (1 / replicas for a router that ignores prefixes)."""
        return self.same_replica / max(1, self.later_turns)


def stream_turn(client: httpx.Client, url: str, history: list[dict], n_predict: int) -> tuple[str, dict, str, bool]:
    """One streamed request: -> (answer, final timings, replica, whether any data came); raises
    httpx.HTTPError (with .got_data set) when it fails."""
    body = {"messages": history, "max_tokens": n_predict, "temperature": 0, "stream": True, "seed": 1}
    text, timings, got = [], {}, False
    try:
        with client.stream("POST", url + "/v1/chat/completions", json=body) as r:
            if r.status_code != 200:
                raise httpx.HTTPStatusError(f"HTTP {r.status_code}: {r.read()[:200]!r}", request=r.request, response=r)
            replica = r.headers.get("x-slotserver-replica", "?")
            for line in r.iter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                got = True
                chunk = json.loads(line[6:])
                timings = chunk.get("timings", timings)
                for choice in chunk.get("choices", []):
                    text.append(choice.get("delta", {}).get("content") or "")
    except httpx.HTTPError as e:
        e.got_data = got
        raise
    if not timings:
        raise httpx.RemoteProtocolError("stream ended without timings")
    return "".join(text), timings, replica, got


def conversation(i: int, args, url: str, run: Run, done: list[int]) -> None:
    client = httpx.Client(timeout=600)
    rng = random.Random(1000 + i)
    history = [{"role": "system", "content": SYSTEM},
               {"role": "user", "content": f"Task {i}: the test test_{rng.randint(0, 99999)} fails with "
                                           f"{tool_output(rng, 20)}. Find and fix the cause."}]
    previous = 0   # the previous turn's prompt + answer tokens: what this turn re-sends
    last_replica = None
    for t in range(args.turns):
        while True:
            try:
                answer, tm, replica, _ = stream_turn(client, url, history, args.n_predict)
                break
            except httpx.HTTPError as e:
                with run.lock:
                    if getattr(e, "got_data", False):
                        run.cut_mid_stream += 1      # the agent re-sends the turn
                    else:
                        run.lost_before_stream += 1
                        print(f"  conversation {i} turn {t}: lost before streaming: {e}", flush=True)
                time.sleep(0.2)
        with run.lock:
            cached, computed = int(tm.get("cache_n", 0)), int(tm.get("prompt_n", 0))
            run.cached, run.computed = run.cached + cached, run.computed + computed
            run.history, run.history_reused = run.history + previous, run.history_reused + min(cached, previous)
            run.requests += 1
            run.by_replica[replica] = run.by_replica.get(replica, 0) + 1
            if last_replica is not None:
                run.later_turns += 1
                run.same_replica += replica == last_replica
            done[0] += 1
        previous = cached + computed + int(tm.get("predicted_n", 0))
        last_replica = replica
        history += [{"role": "assistant", "content": answer},
                    {"role": "user", "content": f"Tool output {t}:\n{tool_output(rng, args.words)}\nWhat next?"}]
    client.close()


def start(cmd: list[str], port: int, what: str, log: Path) -> subprocess.Popen:
    proc = subprocess.Popen(cmd, stdout=log.open("w"), stderr=subprocess.STDOUT)
    wait_healthy(port, what, proc, timeout_s=300)
    return proc


def fleet(args, policy: str, logs: Path) -> tuple[list[subprocess.Popen], subprocess.Popen, str]:
    ports = [free_port() for _ in range(args.replicas)]
    cmds = [PY + ["serve", "--port", str(p), "-np", str(args.np), "-t", str(args.threads), "--metrics",
                  "--no-watch", *shlex.split(args.replica_flags)] for p in ports]
    procs = [subprocess.Popen(c, stdout=(logs / f"replica{k}.log").open("w"), stderr=subprocess.STDOUT)
             for k, c in enumerate(cmds)]
    for k, (p, proc) in enumerate(zip(ports, procs)):
        wait_healthy(p, f"replica {k}", proc, timeout_s=300)
    rport = free_port()
    ups = [a for p in ports for a in ("--upstream", f"http://127.0.0.1:{p}")]
    router = start(PY + ["router", "--port", str(rport), "--policy", policy, "--health-interval", "0.5", *ups],
                   rport, "router", logs / f"router-{policy}.log")
    return procs, router, f"http://127.0.0.1:{rport}"


def cpu_seconds(pid: int) -> float:
    """utime + stime of a live process (its threads included), from /proc; 0 where unreadable."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def stop(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            p.terminate()
    for p in procs:
        try:
            p.wait(20)
        except subprocess.TimeoutExpired:
            p.kill()


def one_run(args, policy: str, logs: Path, kill_at: float | None = None) -> Run:
    procs, router, url = fleet(args, policy, logs)
    run, done = Run(policy if kill_at is None else policy + " + kill"), [0]
    total = args.conversations * args.turns
    try:
        cpu0 = sum(cpu_seconds(p.pid) for p in procs)   # start-up (load, warmup) left out
        t0 = time.perf_counter()
        with ThreadPoolExecutor(args.conversations) as pool:
            futures = [pool.submit(conversation, i, args, url, run, done) for i in range(args.conversations)]
            while kill_at is not None and done[0] < kill_at * total:
                time.sleep(0.05)
            if kill_at is not None:
                procs[0].kill()
                print(f"  replica 0 killed after {done[0]} of {total} requests", flush=True)
            for f in futures:
                f.result()
        run.wall_s = time.perf_counter() - t0
        run.cpu_s = sum(cpu_seconds(p.pid) for p in procs if p.poll() is None) - cpu0
        run.routed = httpx.get(url + "/router/replicas").json()["routed"]
    finally:
        stop([router, *procs])
    return run


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--replicas", type=int, default=3)
    ap.add_argument("--np", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1, help="-t of each replica")
    ap.add_argument("--conversations", type=int, default=12)
    ap.add_argument("--turns", type=int, default=8)
    ap.add_argument("--words", type=int, default=100, help="words of tool output per turn")
    ap.add_argument("--n-predict", type=int, default=16)
    ap.add_argument("--replica-flags", default="", help="more `slotserver serve` flags for every replica")
    ap.add_argument("--logs", type=Path, default=Path("/tmp/replica_bench"))
    ap.add_argument("--skip-kill", action="store_true")
    ap.add_argument("--policies", default="prefix,round-robin",
                    help="the runs, in this order (the host's load drifts: run both orders to see it)")
    args = ap.parse_args()
    args.logs.mkdir(parents=True, exist_ok=True)
    runs = []
    for policy in args.policies.split(","):
        print(f"policy {policy} ...", flush=True)
        runs.append(one_run(args, policy, args.logs))
    if not args.skip_kill:
        print("policy prefix, replica 0 killed at 1/3 ...", flush=True)
        runs.append(one_run(args, "prefix", args.logs, kill_at=1 / 3))
    print(f"\n{args.replicas} replicas x -np {args.np} -t {args.threads}, {args.conversations} conversations x "
          f"{args.turns} turns, n_predict {args.n_predict}, replica flags: {args.replica_flags or '(defaults)'}")
    print(f"{'run':<20} {'requests':>8} {'affinity':>8} {'hit rate':>9} {'history':>8} {'cached':>8} {'computed':>9} {'wall s':>8} "
          f"{'cpu s':>7} {'lost':>5} {'cut':>4}  routed / per replica")
    for r in runs:
        print(f"{r.policy:<20} {r.requests:>8} {r.affinity_rate():>8.1%} {r.hit_rate():>9.1%} {r.history_rate():>8.1%} {r.cached:>8} "
              f"{r.computed:>9} {r.wall_s:>8.1f} {r.cpu_s:>7.1f} {r.lost_before_stream:>5} {r.cut_mid_stream:>4}  "
              f"{r.routed} {sorted(r.by_replica.values())}")
    by_name = {r.policy: r for r in runs}
    if "prefix" not in by_name or "round-robin" not in by_name:
        return
    base, ours = by_name["round-robin"], by_name["prefix"]
    print(f"prefix vs round-robin: later turns on the replica holding their history {ours.affinity_rate():.1%} "
          f"vs {base.affinity_rate():.1%}; hit rate {ours.hit_rate():.1%} vs {base.hit_rate():.1%} (re-sent history "
          f"reused {ours.history_rate():.1%} vs {base.history_rate():.1%}), prompt tokens computed "
          f"{base.computed / max(1, ours.computed):.2f}x fewer, total time {base.wall_s / ours.wall_s:.2f}x faster, "
          f"replica CPU time {base.cpu_s / max(ours.cpu_s, 1e-9):.2f}x less")


if __name__ == "__main__":
    main()
