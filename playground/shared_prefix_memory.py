"""32 requests sharing a 2k-token prefix on a paged layout: how many KV blocks they hold at the peak
(issue 37: the prefix's KV held once), with prefix sharing and with `cache_prompt: false` (each
request computes and keeps its own copy), and how long the whole batch takes.

    .venv/bin/python playground/shared_prefix_memory.py [--n 32] [--prefix 2048]

The default model, driven step by step on this thread (no HTTP); the counts are the allocator's
blocks in use (layouts/paged.py, 16 cells a block), read after every step.
"""

from __future__ import annotations

import argparse
import time

from slotserver.engine.config import EngineConfig
from slotserver.engine.engine import Engine
from slotserver.engine.request import Request
from slotserver.model.bundle import ModelBundle
from slotserver.model.config import ModelConfig
from slotserver.model.default_model import default_model_path
from slotserver.model.sampling.params import SamplingParams


def run(bundle: ModelBundle, n: int, prefix: int, share: bool) -> tuple[int, float, list[int]]:
    """-> (peak blocks in use, seconds, each request's cached prompt tokens)."""
    eng = Engine(bundle, EngineConfig(n_parallel=n, ctx_size=n * (prefix + 64)))
    common = [100 + (i * 7) % 5000 for i in range(prefix)]
    handles = [eng.submit(Request(tuple(common + [6000 + i, 6100 + i]), SamplingParams(temperature=0.0),
                                  n_predict=4, ignore_eos=True, cache_prompt=share)) for i in range(n)]
    blocks, peak, t0 = eng.cache.layout.blocks, 0, time.perf_counter()
    while eng.step():
        peak = max(peak, blocks.alloc.n_used)
    wall = time.perf_counter() - t0
    return peak, wall, [h.result(timeout=0).final.n_cached for h in handles]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=32)
    ap.add_argument("--prefix", type=int, default=2048)
    a = ap.parse_args()
    bundle = ModelBundle.load(ModelConfig(default_model_path(), dtype="auto", layout="paged",
                                          max_ctx=a.prefix + 64))
    for share in (True, False):
        peak, wall, cached = run(bundle, a.n, a.prefix, share)
        print(f"{'sharing' if share else 'cache_prompt false'}: peak {peak} blocks in use, {wall:.1f} s, "
              f"cached prompt tokens per request: {sorted(set(cached))}", flush=True)


if __name__ == "__main__":
    main()
