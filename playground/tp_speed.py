"""Decode speed and per-rank memory of `--tp N` against one process (docs/scaling.md's numbers).

    python playground/tp_speed.py [-m MODEL] [--dtype auto|float32] [-n 64]            # one process
    torchrun --nproc-per-node 2 playground/tp_speed.py --tp 2 [...]                    # two ranks

Rank 0 prints: prompt time, decode tokens/s (greedy, ignore EOS, after one warm-up run), and each
rank's weights and KV bytes. The ranks split the host's cores (-t 0 under --tp).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from slotserver.model.bundle import ModelBundle
from slotserver.model.config import DEFAULT_LAYOUT, ModelConfig
from slotserver.model.default_model import default_model_path
from slotserver.model.generate import GenRequest, generate
from slotserver.model.sampling.params import SamplingParams
from slotserver.parallel.session import TPSession
from slotserver.runtime.cpu_features import physical_cores


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("-m", "--model", type=Path, default=None)
    p.add_argument("--dtype", default="auto")
    p.add_argument("--tp", type=int, default=0)
    p.add_argument("-n", type=int, default=64)
    a = p.parse_args()
    tp = TPSession.start(a.tp, [])
    threads = tp.threads(physical_cores()) if tp else physical_cores()
    bundle = ModelBundle.load(ModelConfig(a.model or default_model_path(), dtype=a.dtype, threads=threads))
    if tp is not None:
        tp.prepare(bundle.model)
        if not tp.leads:
            tp.serve(bundle.model)
            return
    ids = bundle.tokenizer.encode("Once upon a time, in a small village by the sea,", add_special=True)
    make = (lambda spec: tp.cache(spec, DEFAULT_LAYOUT)) if tp else None
    run = lambda n: generate(bundle.model, [GenRequest(ids, n, SamplingParams(temperature=0.0), True)],  # noqa: E731
                             frozenset(), make_cache=make)
    run(4)
    t0 = time.perf_counter()
    run(1)
    t1 = time.perf_counter()
    out = run(a.n)[0]
    t2 = time.perf_counter()
    decode = (t2 - t1 - (t1 - t0)) / (len(out.tokens) - 1)
    print(f"tp {tp.comm.world if tp else 1}, {threads} threads/rank, {bundle.model.device}: prompt {len(ids)} tok "
          f"{(t1 - t0) * 1e3:.1f} ms, decode {1 / decode:.1f} tok/s ({decode * 1e3:.2f} ms/token)")
    if tp is not None:
        for m in tp.report(bundle.model, tp.leader.current):
            print(f"  rank {m['rank']}: weights {m['weights_bytes'] / 2**20:.1f} MiB, KV {m['kv_bytes'] / 2**20:.2f} MiB "
                  f"({m['kv_heads']} KV heads)")
        tp.stop()


if __name__ == "__main__":
    torch.set_grad_enabled(False)
    main()
