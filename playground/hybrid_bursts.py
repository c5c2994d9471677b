"""moe_bursts.py for a hybrid model (Qwen3.5, LFM2): alternating short bursts against llama.cpp.

A hybrid model's recurrent states cannot be put back to an earlier position, so where
moe_bursts.py revisits decode positions, each stream here goes on from where it stands (every
burst 16 positions deeper; the cache holds them all). The rest is moe_bursts.py's: pp128, and
16 decode steps at batch 1, 8 and 32, 128 deep, llama.cpp (llama-bench, llama-batched-bench) then
slotserver (`serve`'s load: `--dtype auto`, the file's blocks, f16 KV), N times.

    .venv/bin/python playground/hybrid_bursts.py --llama-bin DIR --model F.gguf [-n 8] [--threads 2]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

import torch

from moe_bursts import llama
from slotserver.engine.kv_cache import KVCache
from slotserver.model.config import ModelConfig
from slotserver.model.model import LlamaModel
from slotserver.runtime.batch import Batch, SeqChunk
from slotserver.runtime.kv_spec import KVSpec

DEPTH, WHAT = 128, ("pp128", "tg b=1", "tg b=8", "tg b=32")


def setup(path: str, bursts: int):
    cfg = ModelConfig(Path(path), dtype="auto", weights="auto")
    model = LlamaModel.load(cfg.model_path, cfg.torch_dtype, max_pos=DEPTH + 48 * bursts + 64, fmt=cfg.weight_format)
    s = model.spec
    cache = KVCache.create(cfg.layout, KVSpec(s.n_kv_layers, 33, DEPTH + 48 * bursts + 64, s.n_kv_heads, s.head_dim,
                                              torch.float16))
    toks = torch.randint(100, 20000, (DEPTH,), generator=torch.Generator().manual_seed(0)).tolist()
    for b in range(32):
        model.forward(Batch.build([SeqChunk(b, 0, toks, logits=False)]), cache)
    return model, cache, toks, [DEPTH] * 32


def ours(model, cache, toks, pos: list[int], what: str) -> float:
    logits = torch.empty(32, model.weights.output.out_features)
    if what == "pp128":   # stream 32: a prompt from 0 each time
        t = time.perf_counter()
        model.forward(Batch.build([SeqChunk(32, 0, toks)]), cache, logits)
        return len(toks) / (time.perf_counter() - t)
    b = int(what.split("=")[1])
    t = time.perf_counter()
    for _ in range(16):
        model.forward(Batch.build([SeqChunk(s, pos[s], [500]) for s in range(b)]), cache, logits)
        for s in range(b):
            pos[s] += 1
    return 16 * b / (time.perf_counter() - t)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--llama-bin", required=True, type=Path)
    ap.add_argument("--model", required=True)
    ap.add_argument("-n", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    model, cache, toks, pos = setup(args.model, args.n)
    got = {(side, w): [] for side in ("llama.cpp", "slotserver") for w in WHAT}
    for i in range(args.n):
        for w in WHAT:
            got[("llama.cpp", w)].append(llama(args.llama_bin, args.model, args.threads, w))
            got[("slotserver", w)].append(ours(model, cache, toks, pos, w))
        print(f"burst {i + 1} (load {os.getloadavg()[0]:.1f}): " + "  ".join(
            f"{w} {got[('llama.cpp', w)][-1]:.1f} / {got[('slotserver', w)][-1]:.1f}" for w in WHAT), flush=True)
    print(f"model {Path(args.model).name}, {args.threads} threads, tokens/s over {args.n} alternating bursts "
          f"(llama.cpp / slotserver, ratio)")
    for w in WHAT:
        a, b = got[("llama.cpp", w)], got[("slotserver", w)]
        print(f"{w:8} best {max(a):8.1f} / {max(b):8.1f} ({max(b) / max(a):4.2f})   median "
              f"{statistics.median(a):8.1f} / {statistics.median(b):8.1f} ({statistics.median(b) / statistics.median(a):4.2f})")


if __name__ == "__main__":
    main()
