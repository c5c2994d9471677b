"""Decode and prefill speed of two running servers on token-id prompts, side by side, alternating.

Why not `slotserver bench`: a random-weight speed model (playground/make_moe_fixtures.py --size big)
has a made-up vocabulary, so its answers are no text and an OpenAI client sees empty streams. This
posts llama-server's `/completion` with prompt ids, `ignore_eos`, greedy, `cache_prompt` off, to
both servers (slotserver speaks it too), `concurrency` requests at once, and reads the server's own
`timings` (prompt and generated tokens per second per request) plus the wall time of each round.

    .venv/bin/python playground/ids_bench.py --a 8091 --b 8092 [--prompt 128 --predict 64 --conc 1 8 32]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import numpy as np


def complete(port: int, ids: list[int], n_predict: int) -> dict:
    body = json.dumps({"prompt": ids, "n_predict": n_predict, "temperature": 0, "ignore_eos": True,
                       "cache_prompt": False}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/completion", body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        return json.loads(r.read())


def round_(port: int, prompts: list[list[int]], n_predict: int, conc: int) -> tuple[float, float, float]:
    """-> (generated tok/s over the round's wall time, median per-request decode tok/s, median prompt tok/s)."""
    t0 = time.perf_counter()
    with ThreadPoolExecutor(conc) as pool:
        out = list(pool.map(lambda ids: complete(port, ids, n_predict), prompts))
    wall = time.perf_counter() - t0
    gen = sum(o["tokens_predicted"] for o in out)
    return (gen / wall, statistics.median(o["timings"]["predicted_per_second"] for o in out),
            statistics.median(o["timings"]["prompt_per_second"] for o in out))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--a", type=int, required=True, help="slotserver's port")
    ap.add_argument("--b", type=int, required=True, help="the peer's port")
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--predict", type=int, default=64)
    ap.add_argument("--conc", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--vocab", type=int, default=300, help="prompt ids drawn below this")
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    print(f"{'conc':>4} {'server':>6} {'gen tok/s':>10} {'decode/req':>11} {'prompt/req':>11}")
    for conc in args.conc:
        rows = {"a": [], "b": []}
        for _ in range(args.rounds):
            prompts = [rng.integers(0, args.vocab, args.prompt).tolist() for _ in range(conc)]
            for name, port in (("a", args.a), ("b", args.b)):
                rows[name].append(round_(port, prompts, args.predict, conc))
        for name in rows:
            med = [statistics.median(r[i] for r in rows[name]) for i in range(3)]
            print(f"{conc:>4} {name:>6} {med[0]:>10.1f} {med[1]:>11.1f} {med[2]:>11.1f}")
        a, b = (statistics.median(r[0] for r in rows[n]) for n in "ab")
        print(f"{conc:>4} {'a / b':>6} {a / b:>10.2f}")


if __name__ == "__main__":
    main()
