"""Where does one forward step's time go? Decode at batch 1 / 8 / 32, prefill, and a mixed step.

Times every matmul (`Linear` / `QLinear`, the vocab-sized output apart; the qmatmul / q4_matmul
kernels they call are inside those), every KV write and every other kernel of the `KernelSet`
inside the real forward of the default model; "other" is the rest (embedding, residual adds,
casts, views). Also times a mixed step (N decodes + one 128-token prefill) against
its two halves run alone. Numbers in docs/performance.md, section 4.

    .venv/bin/python playground/step_breakdown.py [--config auto:auto] [--steps 10]
"""

from __future__ import annotations

import argparse
import collections
import statistics
import time

import slotserver.runtime.kernel_set as kernel_set_mod
import slotserver.model.linear as linear_mod
from cpu_formats import setup
from slotserver.runtime.batch import Batch, SeqChunk


MATMUL_OPS = ("qmatmul", "q4_matmul")


def instrument(model, cache) -> dict[str, float]:
    """Wrap Linear / QLinear calls and cache writes with timers; -> the accumulator (name -> seconds)."""
    acc: dict[str, float] = collections.defaultdict(float)
    write = type(cache).write
    vocab = model.spec.vocab_size

    def timed(call):
        def timed_call(self, x, ops=None):
            t = time.perf_counter()
            y = call(self, x, ops)
            acc["output" if self.out_features == vocab else "linear"] += time.perf_counter() - t
            return y
        return timed_call

    for cls in (linear_mod.Linear, linear_mod.QLinear):
        cls.__call__ = timed(cls.__call__)

    def timed_write(self, *args, **kwargs):
        t = time.perf_counter()
        write(self, *args, **kwargs)
        acc["kv write"] += time.perf_counter() - t

    type(cache).write = timed_write
    return acc


def forward_times(model, cache, chunks: list[SeqChunk], steps: int) -> list[float]:
    """Seconds of each of `steps` forwards of the same batch shape (the batch built outside the clock)."""
    times = []
    for _ in range(steps):
        batch = Batch.build(chunks)
        t = time.perf_counter()
        model.forward(batch, cache)
        times.append(time.perf_counter() - t)
    return times


def breakdown(model, cache, acc, chunks: list[SeqChunk], steps: int) -> tuple[float, dict[str, float]]:
    """-> (median step ms, mean ms per part) over `steps` forwards of the same batch shape."""
    model.forward(Batch.build(chunks), cache)
    acc.clear()
    kernel_set_mod.TIME_EVERY = 1   # every call timed here (the server times one in 8)
    for v in model.kernels.timings.values():
        v[:] = [0, 0.0, 0]
    times = forward_times(model, cache, chunks, steps)
    parts = {k: 1000 * v / steps for k, v in acc.items()}
    parts.update({op: 1000 * s / steps for op, (n, s, _) in model.kernels.timings.items()
                  if n and op not in MATMUL_OPS})   # those run inside "linear" / "output"
    parts["other"] = 1000 * sum(times) / steps - sum(parts.values())
    return 1000 * statistics.median(times), parts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="auto:auto")
    ap.add_argument("--steps", type=int, default=10)
    args = ap.parse_args()
    model, cache, toks = setup(args.config)
    acc = instrument(model, cache)
    shapes = {f"decode b={b}": [SeqChunk(s, 130, [500]) for s in range(b)] for b in (1, 8, 32)}
    shapes.update({f"prefill {n}x128": [SeqChunk(s, 0, toks) for s in range(n)] for n in (1, 4)})
    print(f"{args.config}; ms per step (mean per part over {args.steps} steps)")
    for name, chunks in shapes.items():
        ms, parts = breakdown(model, cache, acc, chunks, args.steps)
        print(f"{name:15} {ms:7.1f}  " + "  ".join(f"{k} {v:.1f}" for k, v in parts.items()))
    for n in (7, 31):
        dec, pre = [SeqChunk(s, 130, [500]) for s in range(n)], [SeqChunk(n, 0, toks)]
        a, b, both = (breakdown(model, cache, acc, c, args.steps)[0] for c in (dec, pre, dec + pre))
        print(f"mixed: {n} decodes {a:.1f} ms + one 128-token prefill {b:.1f} ms -> together {both:.1f} ms")


if __name__ == "__main__":
    main()
