"""Tokens/s of JSON-schema-constrained requests vs the same free requests, at concurrency 1 and 8.

In-process engine on the default model (the serving dtype, `--dtype auto`), requests submitted
straight to the engine so the numbers are the engine's (no HTTP). Every request decodes exactly
N tokens: the free ones with ignore_eos, the constrained ones under a schema whose string must be
longer than N tokens, so both decode the same count and the only difference is the grammar
(mask filled by llguidance during the forward, applied in the batched sampler, matcher advanced
in postprocess). Rounds alternate free / constrained; the median of each is printed.

    .venv/bin/python playground/grammar_bench.py [--rounds 3] [--tokens 96]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import threading
import time

from slotserver.engine.config import EngineConfig
from slotserver.engine.engine import Engine
from slotserver.engine.grammar import compile_constraint
from slotserver.engine.request import Request
from slotserver.model.bundle import ModelBundle
from slotserver.model.config import ModelConfig
from slotserver.model.default_model import default_model_path
from slotserver.model.sampling.params import SamplingParams

SCHEMA = {"type": "object", "required": ["story", "year"], "additionalProperties": False,
          "properties": {"story": {"type": "string", "minLength": 4000}, "year": {"type": "integer"}}}


def run(engine: Engine, prompt: list[int], c: int, n: int, grammar: str | None) -> float:
    """Tokens/s of `c` concurrent requests of `n` tokens each (wall clock, first submit to last final)."""
    reqs = [Request(tuple(prompt), SamplingParams(temperature=0.8, seed=i), n_predict=n, ignore_eos=grammar is None,
                    grammar=grammar, cache_prompt=False) for i in range(c)]
    t0 = time.perf_counter()
    handles = [engine.submit(r) for r in reqs]
    total = sum(len(h.result(timeout=600).tokens) for h in handles)
    dt = time.perf_counter() - t0
    assert total == c * n, f"expected {c * n} tokens, got {total}"
    return total / dt


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=96)
    ap.add_argument("--dtype", default="auto")
    a = ap.parse_args()
    bundle = ModelBundle.load(ModelConfig(default_model_path(), dtype=a.dtype))
    engine = Engine(bundle, EngineConfig(n_parallel=8, ctx_size=8 * 512)).start()
    prompt = bundle.tokenizer.encode("Write a long story as JSON:", add_special=True)
    grammar = compile_constraint("json_schema", SCHEMA)
    engine.grammars.check(grammar)
    run(engine, prompt, 2, 8, grammar)   # warm-up: vocabulary view, executor, kernels
    flags = subprocess.run("grep -o 'avx512[a-z_]*\\|amx[a-z_]*\\|avx2' /proc/cpuinfo | sort -u | tr '\\n' ' '",
                           shell=True, capture_output=True, text=True).stdout
    print(f"dtype {bundle.model.dtype}, threads {threading.active_count()} py threads; CPU flags: {flags}")
    for c in (1, 8):
        free, constrained = [], []
        for _ in range(a.rounds):
            free.append(run(engine, prompt, c, a.tokens, None))
            constrained.append(run(engine, prompt, c, a.tokens, grammar))
        f, g = statistics.median(free), statistics.median(constrained)
        print(f"c={c}: free {f:7.1f} tok/s  json_schema {g:7.1f} tok/s  overhead {100 * (f - g) / f:+5.1f}%"
              f"  (rounds free {[round(x) for x in free]}, schema {[round(x) for x in constrained]})")
    engine.stop()


if __name__ == "__main__":
    main()
