"""What do the native CPU kernels buy? Whole forward steps, torch-only vs native, side by side.

Loads the default model twice in one process (bfloat16, auto4): once with the AMX int4 kernel
(`WeightFormat.native_max_rows`, the serving default) and once without (torch's int4 kernel up to 8
rows, dense above). Then measures, interleaved in rounds so machine noise hits both alike, decode
steps at several batch sizes and a 4 x 128-token prefill, with the kernels' C forms on (native) or
off (their torch formulations). Prints ms per step and the ratio. Numbers in docs/performance.md.

    .venv/bin/python playground/native_ab.py [--rounds 3] [--batches 1 2 4 8 16 32 48]
"""

from __future__ import annotations

import argparse
import statistics

import torch

from slotserver.runtime.batch import Batch, SeqChunk
from slotserver.model.default_model import default_model_path
from slotserver.engine.kv_cache import KVCache
from slotserver.runtime.kv_spec import KVSpec
from slotserver.model.model import LlamaModel
from slotserver.model.weights import WeightFormat
from step_breakdown import forward_times

DEPTH = 128


def load(native_rows: int) -> LlamaModel:
    return LlamaModel.load(default_model_path(), torch.bfloat16, max_pos=1024,
                           fmt=WeightFormat("auto4", native_max_rows=native_rows))


def set_c_kernels(model: LlamaModel, on: bool, saved: dict) -> None:
    """Swap each kernel module's compiled library in (on) or out (off: its torch formulation)."""
    for op, loaded in model.kernels.modules.items():
        mod = loaded.module
        if hasattr(mod, "_LIB"):
            saved.setdefault(op, mod._LIB)
            mod._LIB = saved[op] if on else None


def step_ms(model: LlamaModel, cache, chunks: list[SeqChunk], steps: int) -> float:
    return 1000 * statistics.median(forward_times(model, cache, chunks, steps))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32, 48])
    args = ap.parse_args()
    models = {"torch": load(0), "native": load(WeightFormat().native_max_rows)}
    s, n_seq = models["torch"].spec, max(args.batches) + 4
    cache = KVCache.create("seq_head_dim", KVSpec(s.n_layers, n_seq, DEPTH + 64, s.n_kv_heads, s.head_dim, torch.bfloat16))
    toks = torch.randint(100, 20000, (DEPTH,), generator=torch.Generator().manual_seed(0)).tolist()
    for b in range(n_seq):
        models["torch"].forward(Batch.build([SeqChunk(b, 0, toks, logits=False)]), cache)
    shapes = {f"decode b={b}": [SeqChunk(j, DEPTH, [500]) for j in range(b)] for b in args.batches}
    shapes["prefill 4x128"] = [SeqChunk(n_seq - 4 + j, 0, toks) for j in range(4)]
    saved: dict = {}
    res: dict[tuple[str, str], list[float]] = {}
    for _ in range(args.rounds):
        for name, model in models.items():
            set_c_kernels(model, name == "native", saved)
            for shape, chunks in shapes.items():
                res.setdefault((name, shape), []).append(step_ms(model, cache, chunks, args.steps))
    print(f"ms per forward step, median of {args.rounds} interleaved rounds; torch threads {torch.get_num_threads()}")
    print(f"{'shape':16}{'torch-only':>12}{'native':>10}{'speed-up':>10}")
    for shape in shapes:
        a, b = (statistics.median(res[(n, shape)]) for n in ("torch", "native"))
        print(f"{shape:16}{a:12.1f}{b:10.1f}{a / b:10.2f}")


if __name__ == "__main__":
    main()
