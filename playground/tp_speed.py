"""Decode speed and per-rank memory of `--tp N` against one process (docs/scaling.md's numbers).

    python playground/tp_speed.py [-m MODEL] [--dtype auto|float32] [-n 64]            # one process
    torchrun --nproc-per-node 2 playground/tp_speed.py --tp 2 [...]                    # two ranks

Rank 0 prints: prompt time, the median and best decode step (greedy, ignore EOS, after a warm-up
run; the median of the steps, as a loaded shared host makes some steps 10x slower), and each
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
    p.add_argument("-t", "--threads", type=int, default=0, help="per rank (0: the cores shared by the ranks)")
    a = p.parse_args()
    tp = TPSession.start(a.tp, [])
    threads = a.threads or (tp.threads(physical_cores()) if tp else physical_cores())
    bundle = ModelBundle.load(ModelConfig(a.model or default_model_path(), dtype=a.dtype, threads=threads))
    if tp is not None:
        tp.prepare(bundle.model)
        if not tp.leads:
            tp.serve(bundle.model)
            return
    ids = bundle.tokenizer.encode("Once upon a time, in a small village by the sea,", add_special=True)
    make = (lambda spec: tp.cache(spec, DEFAULT_LAYOUT)) if tp else None
    req = GenRequest(ids, a.n, SamplingParams(temperature=0.0), True)
    generate(bundle.model, [GenRequest(ids, 4, SamplingParams(temperature=0.0), True)], frozenset(), make_cache=make)
    stamps = [time.perf_counter()]
    generate(bundle.model, [req], frozenset(), lambda i, t: stamps.append(time.perf_counter()), make_cache=make)
    steps = sorted(b - a for a, b in zip(stamps[1:], stamps[2:]))   # decode steps (the first: the prompt)
    med = steps[len(steps) // 2]
    print(f"tp {tp.comm.world if tp else 1}, {threads} threads/rank: prompt {len(ids)} tok "
          f"{(stamps[1] - stamps[0]) * 1e3:.1f} ms, decode median {med * 1e3:.2f} ms/token ({1 / med:.1f} tok/s), "
          f"best {steps[0] * 1e3:.2f} ms")
    if tp is not None:
        for m in tp.report(bundle.model, tp.leader.current):
            print(f"  rank {m['rank']}: weights {m['weights_bytes'] / 2**20:.1f} MiB, KV {m['kv_bytes'] / 2**20:.2f} MiB "
                  f"({m['kv_heads']} KV heads)")
        tp.stop()


if __name__ == "__main__":
    torch.set_grad_enabled(False)
    main()
