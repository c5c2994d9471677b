"""The RAM prompt cache's admission look-up (`PromptCache.best`): the block index against the plain
scan it replaced (`common_prefix` with every entry), on the same entries and prompts.

Cases (640 entries by default, token ids drawn from a 32000-token vocabulary, seeded):
  fleet/own:   entries share a 2000-token system prompt then diverge (300 tokens each); the prompt
               is one entry's history and 50 new tokens (an agent's next turn)
  fleet/new:   the same entries; the prompt is the system prompt and 300 tokens of its own (a new
               agent: every entry ties at 2000 tokens, the index's worst case)
  short/hit:   640 unrelated entries of 50-300 tokens; the prompt continues one of them
  short/miss:  the same entries; a prompt sharing nothing

Prints the median microseconds per look-up of each, side by side. Both answer the same (checked).

    .venv/bin/python playground/prompt_cache_lookup.py [--entries 640] [--shared 2000] [--repeat 200]
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections import OrderedDict

import torch

from slotserver.engine.prompt_cache import PromptCache
from slotserver.engine.slots import common_prefix

VOCAB = 32000


def plain_best(entries: OrderedDict, prompt: tuple[int, ...]) -> tuple[tuple[int, ...], int] | None:
    """The look-up before the index (without its move_to_end, which is O(1) either way)."""
    best, n_best = None, 0
    for tokens in entries:
        n = common_prefix(tokens, prompt)
        if n > n_best:
            best, n_best = tokens, n
    return None if best is None else (best, n_best)


def cases(rng: random.Random, n: int, shared: int) -> dict[str, tuple[list, tuple[int, ...]]]:
    """name -> (entries, prompt)."""
    draw = lambda k: tuple(rng.randrange(VOCAB) for _ in range(k))   # noqa: E731
    system = draw(shared)
    fleet = [system + draw(300) for _ in range(n)]
    short = [draw(rng.randrange(50, 301)) for _ in range(n)]
    return {"fleet/own": (fleet, fleet[n // 2] + draw(50)), "fleet/new": (fleet, system + draw(300)),
            "short/hit": (short, short[n // 2] + draw(50)), "short/miss": (short, draw(300))}


def median_us(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e6


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--entries", type=int, default=640)
    ap.add_argument("--shared", type=int, default=2000)
    ap.add_argument("--repeat", type=int, default=200)
    args = ap.parse_args()
    kv = torch.zeros(1)
    print(f"{'case':<12} {'plain scan us':>14} {'index us':>10} {'speed-up':>9}")
    for name, (entries, prompt) in cases(random.Random(0), args.entries, args.shared).items():
        cache = PromptCache(-1)
        for tokens in entries:
            cache.save(tokens, kv, kv)
        plain = OrderedDict(cache.entries)
        want = plain_best(plain, prompt)
        got = cache.best(prompt)
        assert (got and (got[0], got[2])) == want, name
        t_plain = median_us(lambda: plain_best(plain, prompt), args.repeat)
        t_index = median_us(lambda: cache.best(prompt), args.repeat)
        print(f"{name:<12} {t_plain:>14.1f} {t_index:>10.1f} {t_plain / t_index:>8.0f}x")


if __name__ == "__main__":
    main()
