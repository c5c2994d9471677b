"""Host sampler time per step: the native pass (truncated.py, greedy.py's too) against the batched torch
path they stand in for, interleaved round by round on the same logits.

    .venv/bin/python playground/sampler_bench.py [--vocab 49152] [--rounds 5]

Each config samples a [batch, vocab] float32 logits tensor (random, std 3) with one SamplingParams
for every row: llama-server's default chain (top_k 40, top_p 0.95, min_p 0.05, temperature 0.8),
greedy, and the default chain with a repeat penalty or with n_probs (those two stay on the batched
path: the rows the native pass does not serve). The batched path runs with the native library
set aside (as on a host without a compiler). Prints the median ms per call and the ratio.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from slotserver.model.sampling import truncated
from slotserver.model.sampling.sampler import Sampler, SamplingParams, SequenceRng

CONFIGS = {
    "default chain": SamplingParams(temperature=0.8, seed=1),
    "greedy": SamplingParams(temperature=0.0),
    "repeat penalty 1.1": SamplingParams(temperature=0.8, repeat_penalty=1.1),
    "n_probs 5": SamplingParams(temperature=0.8, n_probs=5),
}


def per_call_ms(sampler: Sampler, logits, params, native: bool, calls: int = 20) -> float:
    lib = truncated._LIB   # greedy.py's CPU pass is truncated.py's too
    if not native:
        truncated._LIB = None
    try:
        rngs, hist = [SequenceRng(i) for i in range(len(params))], [list(range(64))] * len(params)
        sampler.sample(logits, params, rngs, hist)
        t = time.perf_counter()
        for _ in range(calls):
            sampler.sample(logits, params, rngs, hist)
        return (time.perf_counter() - t) / calls * 1e3
    finally:
        truncated._LIB = lib


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--vocab", type=int, default=49152)
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    print(f"torch threads {torch.get_num_threads()}, vocab {a.vocab}; median ms a call of {a.rounds} rounds")
    print(f"{'config':>20} {'batch':>5} {'native':>8} {'batched':>8} {'ratio':>6}")
    for name, p in CONFIGS.items():
        for batch in (1, 8, 32, 64):
            logits = torch.randn(batch, a.vocab, generator=torch.Generator().manual_seed(batch)) * 3
            sampler, native, batched = Sampler(a.vocab), [], []
            for _ in range(a.rounds):
                native.append(per_call_ms(sampler, logits, [p] * batch, True))
                batched.append(per_call_ms(sampler, logits, [p] * batch, False))
            n, b = statistics.median(native), statistics.median(batched)
            print(f"{name:>20} {batch:>5} {n:>8.2f} {b:>8.2f} {b / n:>5.1f}x")


if __name__ == "__main__":
    main()
