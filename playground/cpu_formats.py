"""Which weight format and dtype are fastest for each batch size on this CPU?

Loads the default model once per configuration, then measures, interleaved in rounds so machine
noise hits every configuration alike: prompt processing (one 128-token prefill) and decode steps at
batch 1, 8 and 32 (each sequence 128 tokens deep). Prints tokens per second and the ratio to the
first configuration. The engine's defaults (`--dtype`, `--weights`) come from this table; see
docs/performance.md.

    .venv/bin/python playground/cpu_formats.py [--rounds 3] [--configs float32:dense bfloat16:dense bfloat16:int8 bfloat16:auto]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from slotserver.model.batch import Batch, SeqChunk
from slotserver.model.default_model import default_model_path
from slotserver.engine.kv_cache import KVCache
from slotserver.lab.kv_spec import KVSpec
from slotserver.model.model import LlamaModel
from slotserver.model.weights import WeightFormat

BATCHES = (1, 8, 32)
DEPTH = 128


def setup(config: str):
    dtype_name, fmt = config.split(":")
    dtype = getattr(torch, dtype_name)
    model = LlamaModel.load(default_model_path(), dtype, max_pos=1024, fmt=WeightFormat(fmt))  # the serving thresholds
    s = model.spec
    cache = KVCache.create("seq_head_dim", KVSpec(s.n_layers, max(BATCHES), DEPTH + 64, s.n_kv_heads, s.head_dim, dtype))
    toks = torch.randint(100, 20000, (DEPTH,), generator=torch.Generator().manual_seed(0)).tolist()
    for b in range(max(BATCHES)):
        model.forward(Batch.build([SeqChunk(b, 0, toks, logits=False)]), cache)
    return model, cache, toks


def measure(model, cache, toks, steps: int) -> dict[str, float]:
    out = {}
    t = time.perf_counter()
    model.forward(Batch.build([SeqChunk(0, 0, toks)]), cache)
    out["pp128"] = DEPTH / (time.perf_counter() - t)
    for b in BATCHES:
        times = []
        for i in range(steps):
            batch = Batch.build([SeqChunk(s, DEPTH + i, [500]) for s in range(b)])
            t = time.perf_counter()
            model.forward(batch, cache)
            times.append(time.perf_counter() - t)
        out[f"tg b={b}"] = b / statistics.median(times)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--configs", nargs="+", default=["float32:dense", "bfloat16:dense", "bfloat16:int8", "bfloat16:auto"])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=8)
    args = ap.parse_args()
    loaded = {c: setup(c) for c in args.configs}
    results: dict[str, list[dict]] = {c: [] for c in args.configs}
    for _ in range(args.rounds):
        for c in args.configs:
            results[c].append(measure(*loaded[c], args.steps))
    cols = ["pp128"] + [f"tg b={b}" for b in BATCHES]
    base = {k: statistics.median(r[k] for r in results[args.configs[0]]) for k in cols}
    print(f"tokens/s (median of {args.rounds} interleaved rounds), torch threads {torch.get_num_threads()}; (x) = ratio to {args.configs[0]}")
    print(f"{'config':18}" + "".join(f"{c:>18}" for c in cols))
    for c in args.configs:
        med = {k: statistics.median(r[k] for r in results[c]) for k in cols}
        print(f"{c:18}" + "".join(f"{med[k]:10.1f} ({med[k] / base[k]:4.2f})" for k in cols))


if __name__ == "__main__":
    main()
