"""Time of n=4 choices vs n=1 for a 512-token prompt (issue 18's goal: under 1.5x).

In-process engine on the default model (`--dtype auto`), 4 slots, prompt cache off so every run
prefills. n=4 submits choice 0 and three siblings that copy its prompt KV (Scheduler forks), each
decoding N tokens with its own seed; n=1 decodes N tokens once. Alternating rounds, medians.

    .venv/bin/python playground/n_choices_bench.py [--rounds 3] [--tokens 32]
"""

from __future__ import annotations

import argparse
import statistics
import time

from slotserver.engine.config import EngineConfig
from slotserver.engine.engine import Engine
from slotserver.engine.request import Request
from slotserver.model.bundle import ModelBundle
from slotserver.model.config import ModelConfig
from slotserver.model.default_model import default_model_path
from slotserver.model.sampling.params import SamplingParams


def run(engine: Engine, prompt: tuple[int, ...], n: int, tokens: int, share: bool = True) -> float:
    t0 = time.perf_counter()
    handles = []
    for j in range(n):
        r = Request(prompt, SamplingParams(temperature=1.0, seed=j), n_predict=tokens, ignore_eos=True,
                    cache_prompt=False)
        handles.append(engine.submit(r, parent=handles[0] if handles and share else None))
    for h in handles:
        assert len(h.result(timeout=600).tokens) == tokens
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=32)
    a = ap.parse_args()
    bundle = ModelBundle.load(ModelConfig(default_model_path(), dtype="auto"))
    engine = Engine(bundle, EngineConfig(n_parallel=4, ctx_size=4 * 1024)).start()
    words = ("the river carried old songs past the mill while " * 80).split()
    prompt = tuple(bundle.tokenizer.encode(" ".join(words), add_special=True)[:512])
    run(engine, prompt, 4, 4)   # warm-up
    one, four, unshared = [], [], []
    for _ in range(a.rounds):
        one.append(run(engine, prompt, 1, a.tokens))
        four.append(run(engine, prompt, 4, a.tokens))
        unshared.append(run(engine, prompt, 4, a.tokens, share=False))
    m1, m4, mu = statistics.median(one), statistics.median(four), statistics.median(unshared)
    print(f"prompt {len(prompt)} tokens, {a.tokens} generated per choice, dtype {bundle.model.dtype}")
    print(f"n=1 {m1 * 1000:7.0f} ms   n=4 shared prefill {m4 * 1000:7.0f} ms (x{m4 / m1:.2f})   "
          f"n=4 without sharing {mu * 1000:7.0f} ms (x{mu / m1:.2f})")
    engine.stop()


if __name__ == "__main__":
    main()
