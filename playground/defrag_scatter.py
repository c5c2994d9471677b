"""Scattered occupancy: 5 active sequences on streams 1, 10, 12, 40, 43 of 64 slots.

Decodes the same steps with the streams left scattered (defrag off: attention gathers K/V through
an index) and after sequence defragmentation (defrag on: the 5 streams are copied to 0..4 once,
then attention slices), interleaving the two so machine noise hits both alike, and prints the
decode step time and the attention-only time side by side with their ratio.

    .venv/bin/python playground/defrag_scatter.py [--dtype bfloat16] [--context 256] [--steps 20]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from slotserver.runtime.batch import Batch, SeqChunk
from slotserver.model.default_model import default_model_path
from slotserver.engine.kv_cache import KVCache
from slotserver.runtime.kv_spec import KVSpec
from slotserver.model.model import LlamaModel
from slotserver.engine.stream_map import Move

SCATTERED = [1, 10, 12, 40, 43]
N_SLOTS = 64


def prefill(model, cache, streams, context):
    gen = torch.Generator().manual_seed(0)
    for s in streams:
        toks = torch.randint(100, 20000, (context,), generator=gen).tolist()
        model.forward(Batch.build([SeqChunk(s, 0, toks, logits=False)]), cache)


def time_decode(model, cache, streams, pos, steps):
    step_ms, attn_ms = [], []
    kv, attend = cache.view(0), model.kernels.attention
    for i in range(steps):
        batch = Batch.build([SeqChunk(s, pos + i, [500 + s]) for s in streams])
        t = time.perf_counter()
        model.forward(batch, cache)
        step_ms.append(1000 * (time.perf_counter() - t))
        q = torch.randn(len(streams), model.spec.n_heads, model.spec.head_dim, dtype=model.dtype)
        t = time.perf_counter()
        for _ in range(model.spec.n_layers):
            attend(q, kv, batch.attn, 0.125)
        attn_ms.append(1000 * (time.perf_counter() - t))
    return statistics.median(step_ms), statistics.median(attn_ms)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    ap.add_argument("--context", type=int, default=256, help="tokens already in each active stream")
    ap.add_argument("--steps", type=int, default=10, help="decode steps per timed round")
    ap.add_argument("--rounds", type=int, default=4)
    args = ap.parse_args()
    dtype = getattr(torch, args.dtype)
    model = LlamaModel.load(default_model_path(), dtype, max_pos=args.context + 1024)
    s = model.spec
    n_cells = args.context + args.rounds * args.steps * 2 + 8
    cache = KVCache.create("seq_head_dim", KVSpec(s.n_layers, N_SLOTS + 1, n_cells, s.n_kv_heads, s.head_dim, dtype))
    prefill(model, cache, SCATTERED, args.context)
    t = time.perf_counter()
    cache.apply([Move(src, dst, args.context) for dst, src in enumerate(SCATTERED)])
    move_ms = 1000 * (time.perf_counter() - t)
    packed = list(range(len(SCATTERED)))
    off, on, pos = [], [], args.context
    for _ in range(args.rounds):  # interleaved A/B rounds
        off.append(time_decode(model, cache, SCATTERED, pos, args.steps))
        on.append(time_decode(model, cache, packed, pos, args.steps))
        pos += args.steps
    off_step, off_attn = (statistics.median(x[i] for x in off) for i in (0, 1))
    on_step, on_attn = (statistics.median(x[i] for x in on) for i in (0, 1))
    print(f"model {model.path.name}, {args.dtype}, {len(SCATTERED)} active of {N_SLOTS} slots, "
          f"context {args.context}, torch threads {torch.get_num_threads()}")
    print(f"defrag moves: {cache.n_moves}, {cache.bytes_moved / 2**20:.1f} MiB copied once in {move_ms:.1f} ms")
    print(f"{'':28}{'defrag off':>12}{'defrag on':>12}{'off/on':>9}")
    print(f"{'decode step (ms, median)':28}{off_step:12.2f}{on_step:12.2f}{off_step / on_step:9.3f}")
    print(f"{'attention, 30 layers (ms)':28}{off_attn:12.2f}{on_attn:12.2f}{off_attn / on_attn:9.3f}")


if __name__ == "__main__":
    main()
