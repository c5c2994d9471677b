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


def start(cmd: list[str], port: int, what: str, log: Path) -> subprocess.Popen:
    proc = subprocess.Popen(cmd, stdout=log.open("w"), stderr=subprocess.STDOUT)
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
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--restart-after", type=int, default=0, help="restart slotserver after this turn (0: never)")
    ap.add_argument("--out", type=Path, default=Path("playground/out/agent_loop"))
    a = ap.parse_args()
    if a.model is None:
        from slotserver.model.default_model import default_model_path
        a.model = str(default_model_path())
    a.out.mkdir(parents=True, exist_ok=True)
    ours, peer = free_port(), free_port()
    common = ["-m", a.model, "-np", str(a.slots), "-c", str(a.ctx), "-t", "2"]
    ours_cmd = [sys.executable, "-m", "slotserver.cli.main", "serve", *common, "--port", str(ours), "--no-watch",
                *shlex.split(a.slot_flags)]
    procs = [start(ours_cmd, ours, "slotserver", a.out / "slotserver.log"),
             start([str(PEER / "llama-server"), *common, "--port", str(peer)], peer, "llama-server",
                   a.out / "llama-server.log")]
    system = {"role": "system", "content": "You are a coding agent. Read each tool output and say what to do next."}
    hist = {p: [[dict(system)] for _ in range(a.agents)] for p in (ours, peer)}
    rows = []
    try:
        for t in range(a.turns):
            r = {p: run_turn(p, hist[p], t, a.seed, a.words, a.max_tokens, a.slots) for p in (ours, peer)}
            rows.append((t, *r[ours], *r[peer]))
            if t + 1 == a.restart_after:   # SIGTERM: a clean stop (what --cache-disk saves), then a cold start
                procs[0].terminate()
                procs[0].wait()
                procs[0] = start(ours_cmd, ours, "slotserver", a.out / "slotserver-restarted.log")
                print(f"(slotserver restarted after turn {t + 1})", flush=True)
            (o_ms, o_s, o_n, o_c), (p_ms, p_s, p_n, p_c) = r[ours], r[peer]
            print(f"turn {t + 1}: TTFT p50 {statistics.median(o_ms):7.0f} ms vs {statistics.median(p_ms):7.0f} ms "
                  f"({statistics.median(p_ms) / statistics.median(o_ms):4.2f}x), wall {o_s:5.1f} s vs {p_s:5.1f} s; "
                  f"prompt tokens computed/cached {o_n}/{o_c} vs {p_n}/{p_c}", flush=True)
    finally:
        for p in procs:
            p.terminate()
            p.wait()
    o_all = [m for row in rows for m in row[1]]     # row: turn, then (ms, wall, computed, cached) of each server
    p_all = [m for row in rows for m in row[5]]
    o_total, p_total = sum(row[2] for row in rows), sum(row[6] for row in rows)
    print(f"\n{a.agents} agents on -np {a.slots}, {a.turns} turns, slotserver flags: {a.slot_flags or '(defaults)'}")
    print(f"total {o_total:.1f} s vs llama-server {p_total:.1f} s: {p_total / o_total:.2f}x; "
          f"TTFT p50 {statistics.median(o_all):.0f} vs {statistics.median(p_all):.0f} ms: "
          f"{statistics.median(p_all) / statistics.median(o_all):.2f}x")


if __name__ == "__main__":
    main()
