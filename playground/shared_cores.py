"""The engine on cores shared with other busy work: `--adaptive-threads auto` against `off`.

Each case starts K busy-loop processes (another program taking K cores' worth of time), then runs
the engine, stepped on this thread as the server's engine thread steps it, over `--requests`
greedy requests of `--tokens` tokens at `--batch` at a time, with the tuner on and off in turn
(the order alternates per round). It prints the decode rate of each and the thread count the
tuner ended with. The numbers move with the host; the pairs within a round are comparable.

    .venv/bin/python playground/shared_cores.py                        # default model, K = 0 1 2
    .venv/bin/python playground/shared_cores.py --busy 1 --batch 4 --rounds 3
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import time

import torch

from slotserver.engine.config import EngineConfig
from slotserver.engine.engine import Engine
from slotserver.engine.request import Request
from slotserver.model.bundle import ModelBundle
from slotserver.model.config import ModelConfig
from slotserver.model.default_model import default_model_path
from slotserver.model.sampling.params import SamplingParams
from slotserver.runtime import cpu_features


WANTED = {"amx_bf16", "amx_int8", "avx512_bf16", "avx512_vnni", "avx512f", "avx2"}


def decode_rate(bundle: ModelBundle, mode: str, batch: int, requests: int, tokens: int) -> tuple[float, int]:
    """Generated tokens per second over the whole run, and the tuner's last count (0: off)."""
    engine = Engine(bundle, EngineConfig(n_parallel=batch, ctx_size=batch * 512, adaptive_threads=mode))
    prompt = tuple(bundle.tokenizer.encode("Once upon a time", parse_special=True))
    handles = [engine.submit(Request(prompt + (i,), SamplingParams(temperature=0.0), n_predict=tokens,
                                     ignore_eos=True)) for i in range(requests)]
    t0 = time.perf_counter()
    while engine.step():
        pass
    seconds = time.perf_counter() - t0
    assert all(len(h.result(timeout=0).tokens) == tokens for h in handles)
    stats = engine.stats()
    engine.stop()
    return requests * tokens / seconds, stats.threads


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("-m", "--model", default=None)
    p.add_argument("--busy", type=int, nargs="+", default=[0, 1, 2], help="busy-loop processes per case")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--requests", type=int, default=4)
    p.add_argument("--tokens", type=int, default=96)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("-t", "--threads", type=int, default=2)
    p.add_argument("--dtype", default="auto", help="auto (the CLI's default: GGUF blocks) | float32 | bfloat16")
    a = p.parse_args()
    bundle = ModelBundle.load(ModelConfig(a.model or default_model_path(), threads=a.threads, dtype=a.dtype))
    decode_rate(bundle, "off", a.batch, 1, 8)   # warm-up: step graphs, repacked weights
    print(f"model {bundle.config.model_path.name} ({a.dtype}), -t {a.threads}, batch {a.batch}, "
          f"{a.requests} x {a.tokens} tokens, CPU flags: {' '.join(sorted(cpu_features.host_flags() & WANTED))}")
    for k in a.busy:
        hogs = [subprocess.Popen(["sh", "-c", "while :; do :; done"]) for _ in range(k)]
        try:
            time.sleep(0.3)
            rates: dict[str, list[float]] = {"auto": [], "off": []}
            ends = []
            for r in range(a.rounds):
                for mode in (("auto", "off") if r % 2 == 0 else ("off", "auto")):
                    torch.set_num_threads(a.threads)
                    rate, threads = decode_rate(bundle, mode, a.batch, a.requests, a.tokens)
                    rates[mode].append(rate)
                    if mode == "auto":
                        ends.append(threads)
            auto, off = statistics.median(rates["auto"]), statistics.median(rates["off"])
            print(f"busy loops {k}: auto {auto:6.1f} tok/s {[round(x) for x in rates['auto']]} (threads at the end "
                  f"{ends}), off {off:6.1f} tok/s {[round(x) for x in rates['off']]}: auto/off x{auto / off:.2f}",
                  flush=True)
        finally:
            for h in hogs:
                h.kill()


if __name__ == "__main__":
    main()
