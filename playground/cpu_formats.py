"""Which weight format and dtype are fastest for each batch size on this CPU?

Loads the default model once per configuration (`dtype:weights`; dtype auto as `--dtype auto`
resolves here, weights as `--weights`: q = GGUF blocks + qmatmul), then measures, interleaved in
rounds so machine noise hits every configuration alike: prompt processing (one 128-token prefill)
and decode steps at batch 1, 8 and 32 (each sequence 128 tokens deep). Prints tokens per second
and the ratio to the first configuration. `--load` instead loads each configuration in a fresh
process as the server does (`ModelBundle.load`) and prints seconds and VmRSS after load. The
engine's defaults (`--dtype`, `--weights`) come from this table; see docs/performance.md.

    .venv/bin/python playground/cpu_formats.py [--rounds 3] [--configs auto:q float32:dense bfloat16:auto4] [--load] [--model F.gguf]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import torch

from slotserver.runtime.batch import Batch, SeqChunk
from slotserver.model.config import ModelConfig
from slotserver.model.default_model import default_model_path
from slotserver.engine.kv_cache import KVCache
from slotserver.runtime.kv_spec import KVSpec
from slotserver.model.model import LlamaModel

BATCHES = (1, 8, 32)
MODEL = os.environ.get("SLOTSERVER_MODEL") or default_model_path()   # --model sets it (children inherit it)
DEPTH = 128


def setup(config: str):
    dtype_name, weights = config.split(":")
    cfg = ModelConfig(MODEL, dtype=dtype_name, weights=weights)   # as the CLI resolves them
    dtype = cfg.torch_dtype
    model = LlamaModel.load(cfg.model_path, dtype, max_pos=1024, fmt=cfg.weight_format)  # the serving thresholds
    s = model.spec
    kv = torch.float16 if dtype_name == "auto" else dtype   # the engine's cache type (-ctk auto)
    cache = KVCache.create(cfg.layout, KVSpec(s.n_layers, max(BATCHES), DEPTH + 64, s.n_kv_heads, s.head_dim, kv))  # the serving default
    toks = torch.randint(100, 20000, (DEPTH,), generator=torch.Generator().manual_seed(0)).tolist()
    for b in range(max(BATCHES)):
        model.forward(Batch.build([SeqChunk(b, 0, toks, logits=False)]), cache)
    return model, cache, toks


def measure(model, cache, toks, steps: int) -> dict[str, float]:
    out = {}
    logits = torch.empty(max(BATCHES), model.weights.output.out_features)   # reused, as the engine does
    t = time.perf_counter()
    model.forward(Batch.build([SeqChunk(0, 0, toks)]), cache, logits)
    out["pp128"] = DEPTH / (time.perf_counter() - t)
    for b in BATCHES:
        times = []
        for i in range(steps):
            batch = Batch.build([SeqChunk(s, DEPTH + i, [500]) for s in range(b)])
            t = time.perf_counter()
            model.forward(batch, cache, logits)
            times.append(time.perf_counter() - t)
        out[f"tg b={b}"] = b / statistics.median(times)
    return out


def load_child(config: str) -> None:
    """In a fresh process: load as `slotserver serve` does; print seconds and VmRSS (MiB) as JSON.
    Mapped weight pages count in RSS only once touched (a forward touches them all)."""
    from slotserver.model.bundle import ModelBundle

    dtype, weights = config.split(":")
    t = time.perf_counter()
    bundle = ModelBundle.load(ModelConfig(MODEL, dtype=dtype, weights=weights, max_ctx=1024))
    out = {"load_s": time.perf_counter() - t, "rss_load": _rss_mib()}
    bundle.model.forward(Batch.build([SeqChunk(0, 0, [500, 600, 700])]),
                         KVCache.create("seq_head_dim", KVSpec(bundle.model.spec.n_layers, 1, 64, bundle.model.spec.n_kv_heads,
                                                               bundle.model.spec.head_dim, bundle.model.dtype)))
    print(json.dumps(out | {"rss_step": _rss_mib()}))


def _rss_mib() -> float:
    line = next(ln for ln in open("/proc/self/status") if ln.startswith("VmRSS:"))
    return int(line.split()[1]) / 1024


def load_table(configs: list[str]) -> None:
    print(f"{'config':18}{'load s':>10}{'RSS MiB':>10}{'after 1 step':>14}")
    for c in configs:
        proc = subprocess.run([sys.executable, __file__, "--load-child", c], capture_output=True, text=True, check=True)
        r = json.loads(proc.stdout.strip().splitlines()[-1])
        print(f"{c:18}{r['load_s']:10.2f}{r['rss_load']:10.0f}{r['rss_step']:14.0f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--configs", nargs="+", default=["auto:auto", "float32:dense", "bfloat16:auto4"])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--load", action="store_true", help="load time and RSS per config (fresh processes)")
    ap.add_argument("--load-child", help=argparse.SUPPRESS)
    ap.add_argument("--model", help="a GGUF file (default: the embedded SmolLM2 Q4_1)")
    args = ap.parse_args()
    if args.model:
        global MODEL
        MODEL = os.environ["SLOTSERVER_MODEL"] = args.model
    if args.load_child:
        return load_child(args.load_child)
    if args.load:
        return load_table(args.configs)
    loaded = {c: setup(c) for c in args.configs}
    results: dict[str, list[dict]] = {c: [] for c in args.configs}
    for _ in range(args.rounds):
        for c in args.configs:
            results[c].append(measure(*loaded[c], args.steps))
    cols = ["pp128"] + [f"tg b={b}" for b in BATCHES]
    base = {k: statistics.median(r[k] for r in results[args.configs[0]]) for k in cols}
    print(f"tokens/s (median of {args.rounds} interleaved rounds), torch threads {torch.get_num_threads()}; (x) = ratio to {args.configs[0]}")
    print(f"{'config':18}" + "".join(f"{c:>18}" for c in cols))
    for c in args.configs:
        med = {k: statistics.median(r[k] for r in results[c]) for k in cols}
        print(f"{c:18}" + "".join(f"{med[k]:10.1f} ({med[k] / base[k]:4.2f})" for k in cols))


if __name__ == "__main__":
    main()
