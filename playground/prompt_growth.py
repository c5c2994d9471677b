"""The agent loop's prompt time turn by turn, in one process: is it flat as the history grows?

Each turn of playground/agent_loop.py computes ~615 new prompt tokens per agent on top of the
agent's history (~230 cached tokens at turn 1, ~630 more each turn). Here the default model (as
`serve` loads it: `--dtype auto`, f16 cache) computes one such 615-token prompt chunk after the
history of each turn, timed by the thread's CPU time (best of `--repeat`): on a host shared with
other work that measures the prefill itself, where the HTTP loop measures the neighbours too. The
history cells hold zeros (attention's cost does not depend on the values). Each turn's time is
also split into the attention kernel's calls and the rest (matmuls, norms, rope, K/V writes): the
rest computes the same 615 rows every turn and should be flat; attention reads the whole history.

    nice .venv/bin/python playground/prompt_growth.py [--threads 1] [--turns 8]
    SLOTSERVER_CPU=avx512 ... (prompt rows on the row kernel, as before issue 37's third round)
"""

from __future__ import annotations

import argparse
import time

import torch

from slotserver.engine.kv_cache import KVCache
from slotserver.model.config import ModelConfig
from slotserver.model.default_model import default_model_path
from slotserver.model.model import LlamaModel
from slotserver.runtime.batch import Batch, SeqChunk
from slotserver.runtime.kv_spec import KVSpec

NEW, FIRST, STEP = 615, 230, 630   # tokens a turn computes; history at turn 1; its growth a turn


class TimedAttention:
    """The model's kernels with the attention op's calls timed (`spent`, seconds of `clock`)."""

    def __init__(self, ops, clock) -> None:
        self.ops, self.clock, self.spent = ops, clock, 0.0

    def __getattr__(self, name: str):
        fn = getattr(self.ops, name)
        if name not in ("attention", "paged_attention"):
            return fn

        def timed(*args, **kwargs):
            t0 = self.clock()
            out = fn(*args, **kwargs)
            self.spent += self.clock() - t0
            return out
        return timed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--turns", type=int, default=8)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    clock = time.thread_time if args.threads == 1 else time.perf_counter
    cfg = ModelConfig(default_model_path(), dtype="auto", weights="auto")
    top = FIRST + STEP * (args.turns - 1) + NEW
    model = LlamaModel.load(cfg.model_path, cfg.torch_dtype, max_pos=top + 64, fmt=cfg.weight_format)
    s = model.spec
    cache = KVCache.create("seq_head_dim", KVSpec(s.n_layers, 1, top + 64, s.n_kv_heads, s.head_dim, torch.float16))
    print(f"attention: {model.kernels.modules['attention'].module.cpu_path()}; {args.threads} thread(s)")
    model.kernels = timed = TimedAttention(model.kernels, clock)
    times, rests = [], []
    for turn in range(1, args.turns + 1):
        history = FIRST + STEP * (turn - 1)
        batch = Batch.build([SeqChunk(0, history, list(range(100, 100 + NEW)), prompt=True)])
        best = (float("inf"), 0.0)
        for _ in range(args.repeat + 1):   # the first call warms up
            timed.spent, t0 = 0.0, clock()
            model.forward(batch, cache)
            best = min(best, (clock() - t0, timed.spent))
        times.append(best[0])
        rests.append(best[0] - best[1])
        print(f"turn {turn}: {NEW} tokens after {history}: {best[0] * 1e3:8.1f} ms "
              f"(attention {best[1] * 1e3:7.1f} ms, the rest {rests[-1] * 1e3:7.1f} ms)")
    print(f"turn {args.turns} / turn 1: {times[-1] / times[0]:.2f} (the rest: {rests[-1] / rests[0]:.2f})")


if __name__ == "__main__":
    main()
