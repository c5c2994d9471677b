"""The agent loop of issue 37, side by side: slotserver and llama-server, same model, same turns.

More agents than slots (8 agents on `-np 4`, 4 requests at a time, 8 turns each), so no slot keeps
an agent's history between its turns: each turn appends ~500 tokens of "tool output" to the
agent's own growing conversation and asks for a short greedy answer through
/v1/chat/completions, as an agent framework does. What a server can reuse is the agent's history
up to its last turn; where it is not reused, every turn recomputes the whole conversation.

Both servers stay up and each turn runs on slotserver, then on llama-server (a slow spell of this
noisy machine hits both alike). Per turn: the median time to first token over the 8 agents (the
prompt's time: `timings.prompt_ms`, which both servers report) and the wall time of the turn.

    .venv/bin/python playground/agent_loop.py [--slot-flags "--cache-ram 8192"] [--turns 8]
    .venv/bin/python playground/agent_loop.py --restart-after 5 --slot-flags "--cache-disk /tmp/kv"
        (slotserver stopped and started again after turn 5: what --cache-disk keeps)

Needs the llama.cpp peer (playground/local_server.py says where). Prints a table and the ratios.
"""

from __future__ import annotations

import argparse
import os
import random
import shlex
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from local_server import PEER, free_port, post, wait_healthy  # noqa: E402

WORDS = ("file line error value result return config path token request build test module error "
         "warning output status cache slot model layer kernel stream batch step index queue").split()


def tool_output(rng: random.Random, n_words: int) -> str:
    """~n_words of log-like text (about 1.3 tokens a word with SmolLM2's tokenizer)."""
    lines, words = [], 0
    while words < n_words:
        k = rng.randint(6, 14)
        lines.append(f"[{rng.randint(0, 9999):04d}] " + " ".join(rng.choice(WORDS) for _ in range(k)))
        words += k + 1
    return "\n".join(lines)


def start(cmd: list[str], port: int, what: str, log: Path, env: dict | None = None) -> subprocess.Popen:
    proc = subprocess.Popen(cmd, stdout=log.open("w"), stderr=subprocess.STDOUT,
                            env=None if env is None else {**os.environ, **env})
    wait_healthy(port, what, proc, timeout_s=300)
    return proc


def turn(port: int, history: list[dict], max_tokens: int) -> tuple[float, str, int, int]:
    """One request: -> (prompt ms as the server reports it, the answer text, prompt tokens computed,
    prompt tokens taken from a cache)."""
    r = post(port, "/v1/chat/completions", {"messages": history, "max_tokens": max_tokens, "temperature": 0,
                                             "cache_prompt": True})
    t = r["timings"]
    return float(t["prompt_ms"]), r["choices"][0]["message"]["content"], int(t["prompt_n"]), int(t.get("cache_n", 0))


def run_turn(port: int, agents: list[list[dict]], t: int, seed: int, words: int, max_tokens: int,
             conc: int) -> tuple[list[float], float, int, int]:
    """Turn t of every agent, `conc` at a time: each agent's history grows by a tool result and
    the answer. -> (per-agent prompt ms, wall seconds, prompt tokens computed, taken from a cache)."""
    counts = [[0, 0] for _ in agents]

    def one(i: int) -> float:
        rng = random.Random(seed * 1000 + t * 100 + i)   # the same tool output on both servers
        agents[i].append({"role": "user", "content": f"Tool output {t}:\n{tool_output(rng, words)}\nWhat next?"})
        ms, answer, counts[i][0], counts[i][1] = turn(port, agents[i], max_tokens)
        agents[i].append({"role": "assistant", "content": answer})
        return ms
    t0 = time.perf_counter()
    with ThreadPoolExecutor(conc) as pool:
        ms = list(pool.map(one, range(len(agents))))
    return ms, time.perf_counter() - t0, sum(c[0] for c in counts), sum(c[1] for c in counts)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="GGUF (default: the embedded default model)")
    ap.add_argument("--agents", type=int, default=8)
    ap.add_argument("--slots", type=int, default=4)
    ap.add_argument("--turns", type=int, default=8)
    ap.add_argument("--words", type=int, default=380, help="tool output words a turn (~500 tokens)")
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--ctx", type=int, default=32768)
    ap.add_argument("--slot-flags", default="", help="more slotserver flags, e.g. \"--cache-ram 8192\"")
    ap.add_argument("--before-env", default="",
                    help="also run a second slotserver under these variables, e.g. \"SLOTSERVER_CPU=avx512\" "
                         "(prompt rows on the row kernel, as before AMX served them): an A/B in the same run")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--restart-after", type=int, default=0, help="restart slotserver after this turn (0: never)")
    ap.add_argument("--out", type=Path, default=Path("playground/out/agent_loop"))
    ap.add_argument("--no-peer", action="store_true",
                    help="slotserver(s) only, without llama-server (its turns take minutes on a busy host)")
    a = ap.parse_args()
    if a.model is None:
        from slotserver.model.default_model import default_model_path
        a.model = str(default_model_path())
    a.out.mkdir(parents=True, exist_ok=True)
    common = ["-m", a.model, "-np", str(a.slots), "-c", str(a.ctx), "-t", "2"]

    def ours_cmd(port: int) -> list[str]:
        return [sys.executable, "-m", "slotserver.cli.main", "serve", *common, "--port", str(port), "--no-watch",
                *shlex.split(a.slot_flags)]
    ours, peer = free_port(), free_port()
    names = {ours: "slotserver", peer: "llama-server"}
    procs = {ours: start(ours_cmd(ours), ours, "slotserver", a.out / "slotserver.log")}
    if not a.no_peer:
        procs[peer] = start([str(PEER / "llama-server"), *common, "--port", str(peer)], peer, "llama-server",
                            a.out / "llama-server.log")
    if a.before_env:
        before = free_port()
        env = dict(kv.split("=", 1) for kv in shlex.split(a.before_env))
        names[before] = "slotserver " + a.before_env
        procs[before] = start(ours_cmd(before), before, names[before], a.out / "slotserver-before.log", env)
    ports = [ours, *[p for p in procs if p not in (ours, peer)], *([] if a.no_peer else [peer])]
    system = {"role": "system", "content": "You are a coding agent. Read each tool output and say what to do next."}
    hist = {p: [[dict(system)] for _ in range(a.agents)] for p in ports}
    rows = []   # per turn: {port: (per-agent ms, wall s, computed, cached)}
    try:
        for t in range(a.turns):
            r = {p: run_turn(p, hist[p], t, a.seed, a.words, a.max_tokens, a.slots) for p in ports}
            rows.append(r)
            if t + 1 == a.restart_after:   # SIGTERM: a clean stop (what --cache-disk saves), then a cold start
                procs[ours].terminate()
                procs[ours].wait()
                procs[ours] = start(ours_cmd(ours), ours, "slotserver", a.out / "slotserver-restarted.log")
                print(f"(slotserver restarted after turn {t + 1})", flush=True)
            print(f"turn {t + 1}: " + "; ".join(
                f"{names[p]} TTFT p50 {statistics.median(r[p][0]):.0f} ms, wall {r[p][1]:.1f} s, "
                f"computed/cached {r[p][2]}/{r[p][3]}" for p in ports), flush=True)
    finally:
        for proc in procs.values():
            proc.terminate()
            proc.wait()
    print(f"\n{a.agents} agents on -np {a.slots}, {a.turns} turns, slotserver flags: {a.slot_flags or '(defaults)'}")
    if a.no_peer:
        for p in ports:
            total, p50 = sum(r[p][1] for r in rows), statistics.median(m for r in rows for m in r[p][0])
            first, last = statistics.median(rows[0][p][0]), statistics.median(rows[-1][p][0])
            print(f"{names[p]}: total {total:.1f} s; TTFT p50 {p50:.0f} ms; last turn / first turn TTFT {last / first:.2f}")
        return
    peer_total = sum(r[peer][1] for r in rows)
    peer_p50 = statistics.median(m for r in rows for m in r[peer][0])
    for p in ports[:-1]:
        total, p50 = sum(r[p][1] for r in rows), statistics.median(m for r in rows for m in r[p][0])
        first, last = statistics.median(rows[0][p][0]), statistics.median(rows[-1][p][0])
        print(f"{names[p]}: total {total:.1f} s vs llama-server {peer_total:.1f} s: {peer_total / total:.2f}x; "
              f"TTFT p50 {p50:.0f} vs {peer_p50:.0f} ms: {peer_p50 / p50:.2f}x; "
              f"last turn / first turn TTFT {last / first:.2f}")


if __name__ == "__main__":
    main()
