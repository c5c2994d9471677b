"""moe_bursts.py for a hybrid model (Qwen3.5, LFM2): alternating short bursts against llama.cpp.

A hybrid model's recurrent states cannot be put back to an earlier position, so where
moe_bursts.py revisits decode positions, each stream here goes on from where it stands (every
burst 16 positions deeper; the cache holds them all): slotserver decodes from 128 deep to up to
128 + 48 N, while llama.cpp's benchmarks stay at 128 (a small bias against slotserver). The rest is
moe_bursts.py's: pp128, and 16 decode steps at batch 1, 8 and 32, llama.cpp (llama-bench,
llama-batched-bench) then slotserver (`serve`'s load: `--dtype auto`, the file's blocks, f16 KV), N times.

    .venv/bin/python playground/hybrid_bursts.py --llama-bin DIR --model F.gguf [-n 8] [--threads 2]
"""

from __future__ import annotations

import time
from pathlib import Path

import torch

from moe_bursts import parse_args, run_bursts
from slotserver.engine.kv_cache import KVCache
from slotserver.model.config import ModelConfig
from slotserver.model.model import LlamaModel
from slotserver.runtime.batch import Batch, SeqChunk
from slotserver.runtime.kv_spec import KVSpec

DEPTH = 128


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
    args = parse_args(8)
    torch.set_num_threads(args.threads)
    model, cache, toks, pos = setup(args.model, args.n)
    run_bursts(args, lambda w, i: ours(model, cache, toks, pos, w))


if __name__ == "__main__":
    main()
