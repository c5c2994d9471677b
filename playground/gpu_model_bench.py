"""Model decode speed on a device: ms per step and tokens/s at batch 1/8/32/64, against the bound
the weight and KV bytes per step set at the card's measured copy bandwidth; then the whole engine
(scheduler, sampling on the host, postprocess) generating the same batches.

    python playground/gpu_model_bench.py model.gguf [more.gguf ...] --device cuda --out DIR
    python playground/gpu_model_bench.py /tmp/tiny.gguf --device cpu --batches 1,2 --steps 3   # dry run
    python playground/gpu_model_bench.py model.gguf --device cuda --async-steps off,on   # overlap A/B
    python playground/gpu_model_bench.py tiny.gguf --device cpu --batches 1,2 --steps 3 --async-steps off,on  # its dry run
    python playground/gpu_model_bench.py q4km.gguf --device cuda --gpu-weights dense,blocks --out DIR

--gpu-weights: each model loads once per form listed (model/gpu_weights.py); rows name the form.
--body lean,noq8,old: the same for the layer body on GGUF blocks (model/lean_step.py), patched in this
process: `lean` serves (the lean body, the norms' q8_1 handed to the matmuls), `noq8` the lean body
without that, `old` the body blocks ran before 2026-11-27 (model.py `_body`: lean_step.applies
asked the CPU's qmatmul); rows marked "body=...".
--fused-gemv off,on: the same for ModelConfig.fused_gemv (decode steps of <= 16 rows on kernels/gemv.py's
fused GEMVs, model/gemv_step.py, against the lean body's cuBLAS matmuls); rows marked "+gemv".

    python playground/gpu_model_bench.py qwen-bf16.gguf --device cuda --gpu-weights dense --fused-gemv off,on \
        --batches 1,8,16 --engine-tokens 0 --budget-s 120 --out DIR        # the fused-GEMV A/B

The models are usually random-weight files of real shapes (playground/shape_model.py): a decode
step's time does not depend on the values. Each number is the median over `--steps` steps after
two warm-up steps; on CUDA each step is synchronized. Writes DIR/model_bench.json and prints a table.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import time
from pathlib import Path

import torch

from slotserver.engine.config import EngineConfig
from slotserver.engine.engine import Engine
from slotserver.engine.kv_cache import KVCache
from slotserver.engine.request import Request
from slotserver.model.bundle import ModelBundle
from slotserver.model.config import ModelConfig
from slotserver.model.sampling.params import SamplingParams
from slotserver.runtime.batch import Batch, SeqChunk
from slotserver.runtime.kv_spec import KVSpec


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def copy_bandwidth(device: str, nbytes: int = 1 << 30) -> float:
    """Bytes/s of a device-to-device copy (read + write counted), median of 5."""
    a = torch.empty(nbytes, dtype=torch.uint8, device=device)
    b = torch.empty_like(a)
    times = []
    for _ in range(6):
        sync(device)
        t = time.perf_counter()
        b.copy_(a)
        sync(device)
        times.append(time.perf_counter() - t)
    return 2 * nbytes / statistics.median(times[1:])


def decode_steps(bundle: ModelBundle, batch: int, ctx: int, steps: int, layout: str, graphs: bool = True) -> dict:
    """Prefill `batch` streams to `ctx` tokens, then time decode steps of one token each (replayed
    from step graphs, CUDA graphs on a GPU, or eager: `graphs`)."""
    model, dev = bundle.model, bundle.model.device
    model.set_step_graphs(graphs)
    s = model.spec
    kv_dtype = torch.float16 if dev == "cuda" else model.dtype
    cache = KVCache.create(layout, KVSpec(s.n_layers, batch, ctx + steps + 8, s.n_kv_heads, s.head_dim, kv_dtype,
                                          device=dev))
    toks = torch.randint(100, min(s.vocab_size, 20000), (ctx,), generator=torch.Generator().manual_seed(0)).tolist()
    for b in range(batch):
        model.forward(Batch.build([SeqChunk(b, 0, toks, logits=False)], dev), cache)
    times = []
    for i in range(steps + 2):
        bt = Batch.build([SeqChunk(b, ctx + i, [min(500, s.vocab_size - 1)]) for b in range(batch)], dev)
        sync(dev)
        t = time.perf_counter()
        model.forward(bt, cache)
        sync(dev)
        times.append(time.perf_counter() - t)
    step = statistics.median(times[2:])
    model.set_step_graphs(True)
    weights = sum(m.nbytes() for m in model.weights.matmuls())
    kv = 2 * s.n_layers * batch * (ctx + steps // 2) * s.n_kv_heads * s.head_dim * cache.spec.dtype.itemsize
    return {"batch": batch, "ctx": ctx, "step_ms": 1000 * step, "tok_s": batch / step,
            "weight_bytes": weights, "kv_bytes": kv}


def engine_run(bundle: ModelBundle, batch: int, n_predict: int, prompt_len: int, async_steps: str = "auto") -> dict:
    """The engine generating `batch` requests of `n_predict` tokens (greedy, ignore_eos): tok/s, after
    one warm-up round (Triton compiles, CUDA-graph captures), and the mean ms of each step phase.
    async_steps: EngineConfig's --async-steps (overlapped decode steps, engine/overlap.py)."""
    config = EngineConfig(n_parallel=batch, ctx_size=batch * (prompt_len + n_predict + 16), async_steps=async_steps)
    eng = Engine(bundle, config).start()
    try:
        def round_(first: int) -> tuple[int, float]:
            vocab = bundle.model.spec.vocab_size - 8   # no shared prefix between the rows
            prompts = [tuple(4 + (first + i + j) % vocab for j in range(prompt_len)) for i in range(batch)]
            t = time.perf_counter()
            handles = [eng.submit(Request(prompt_ids=p, n_predict=n_predict, ignore_eos=True,
                                          params=SamplingParams(temperature=0.0))) for p in prompts]
            return sum(len(h.result(timeout=600).tokens) for h in handles), time.perf_counter() - t
        round_(3000)
        n, wall = round_(100)
        phases = dataclasses.asdict(eng.tracker.snapshot.timings)
    finally:
        eng.stop()
    return {"n_predict": n_predict, "engine_tok_s": n / wall, "engine_phase_ms": phases,
            "async_steps": async_steps, "overlapped_steps": eng.overlap.launched}


BODIES = ("lean", "noq8", "old")
_LEAN = {}


def body(mode: str) -> None:
    """model/lean_step.py as `--body mode` wants it, in this process (module docstring)."""
    from slotserver.model import lean_step
    from slotserver.model.linear import QLinear

    _LEAN.setdefault("applies", lean_step.applies)
    _LEAN.setdefault("rows", lean_step.Q8_MAX_ROWS)
    lean_step.Q8_MAX_ROWS = _LEAN["rows"] if mode == "lean" else 0
    served = _LEAN["applies"]
    lean_step.applies = served if mode != "old" else lambda model, ops: served(model, ops) and not (
        isinstance(model.weights.layers[0].qkv, QLinear) and ops.fuses.get("qmatmul", frozenset()) >= {"norm", "glu", "acc"})


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("models", nargs="+", type=Path)
    p.add_argument("--device", default="auto")
    p.add_argument("--batches", default="1,8,32,64")
    p.add_argument("--ctx", type=int, default=512)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--engine-tokens", type=int, default=64, help="tokens per request in the engine run (0: skip)")
    p.add_argument("--layout", default="head_seq_dim")
    p.add_argument("--gpu-weights", default="auto",
                   help="comma-separated --gpu-weights forms to time each model in, e.g. dense,blocks (default auto)")
    p.add_argument("--fused-gemv", default="off",
                   help="comma-separated off/on: load each model once per setting (ModelConfig.fused_gemv), the A/B")
    p.add_argument("--body", default="lean",
                   help="comma-separated lean/noq8/old: load each model once per layer body (the A/B on blocks)")
    p.add_argument("--out", type=Path, default=Path("."))
    p.add_argument("--async-steps", default="auto",
                   help="the engine run's --async-steps; a comma list (off,on) runs the engine once per mode: the A/B")
    p.add_argument("--budget-s", type=float, default=0.0,
                   help="stop starting new rows after this many seconds (0: no limit); the table covers what ran")
    a = p.parse_args()
    modes = [EngineConfig(async_steps=m).async_steps for m in a.async_steps.split(",")]   # a bad mode: one line
    t_start = time.perf_counter()
    batches = [int(b) for b in a.batches.split(",")]
    rows, bw = [], None
    gemv_modes = [{"off": False, "on": True}[m] for m in a.fused_gemv.split(",")]   # a bad one: KeyError
    bodies = a.body.split(",")
    assert set(bodies) <= set(BODIES), f"--body takes {', '.join(BODIES)}"
    for path, gw, fg, bm in ((path, gw, fg, bm) for path in a.models for gw in a.gpu_weights.split(",")
                             for fg in gemv_modes for bm in bodies):
        body(bm)
        t0 = time.perf_counter()
        bundle = ModelBundle.load(ModelConfig(path, dtype="auto", device=a.device, max_ctx=a.ctx + a.steps + 64,
                                              gpu_weights=gw, fused_gemv=fg))
        dev = bundle.model.device
        print(f"loaded {path.name} ({path.stat().st_size / 1e9:.2f} GB) on {dev} [{bundle.config.gpu_weights}] "
              f"in {time.perf_counter() - t0:.1f} s",
              flush=True)
        bw = bw or copy_bandwidth(dev, 1 << 28 if dev == "cpu" else 1 << 30)
        name = (path.name if dev == "cpu" else f"{path.name} [{bundle.config.gpu_weights}]") + (" +gemv" if fg else "") \
            + (f" body={bm}" if bm != "lean" else "")
        for b in batches:
            if a.budget_s and time.perf_counter() - t_start > a.budget_s:
                print(f"budget of {a.budget_s:.0f} s spent: {path.name} b={b} and later rows skipped", flush=True)
                break
            r = decode_steps(bundle, b, a.ctx, a.steps, a.layout)
            r["eager_step_ms"] = decode_steps(bundle, b, a.ctx, a.steps, a.layout, graphs=False)["step_ms"]
            r.update(model=name, device=dev, bound_tok_s=b * bw / (r["weight_bytes"] + r["kv_bytes"]))
            if a.engine_tokens:   # the first mode's run fills the table; each mode's is under "engine_ab"
                runs = {m: engine_run(bundle, b, a.engine_tokens, 16, m) for m in modes}
                r.update(runs[modes[0]])
                r["engine_ab"] = runs
            rows.append(r)
            print(json.dumps(r), flush=True)
        del bundle   # the next form's weights need the memory
        if dev == "cuda":
            torch.cuda.empty_cache()
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "model_bench.json").write_text(json.dumps({"copy_bytes_s": bw, "rows": rows}, indent=1))
    # the copy's bytes moved per second (read + write) is what the memory delivers; a decode step
    # only reads, so its bound is weights + KV bytes at that rate (the issue's ~6000 tok/s for 0.5B)
    print(f"\ncopy bandwidth {bw / 1e9:.0f} GB/s (read + write); bound = weights + KV bytes read once per step at it")
    print(f"{'model':28} {'b':>3} {'ms/step':>8} {'eager ms':>8} {'tok/s':>9} {'bound':>9} {'of bound':>8} "
          f"{'engine tok/s':>12}")
    for r in rows:
        print(f"{r['model'][:28]:28} {r['batch']:>3} {r['step_ms']:8.2f} {r['eager_step_ms']:8.2f} {r['tok_s']:9.0f} "
              f"{r['bound_tok_s']:9.0f} {r['tok_s'] / r['bound_tok_s']:8.0%} {r.get('engine_tok_s', 0):12.0f}")
    for r in rows:   # --async-steps off,on: the engine's tok/s per mode (and the steps launched ahead)
        if len(r.get("engine_ab", {})) > 1:
            base = r["engine_ab"][modes[0]]["engine_tok_s"]
            print(f"engine async-steps A/B: {r['model'][:28]} b={r['batch']}: " + ", ".join(
                f"{m} {x['engine_tok_s']:.0f} tok/s ({x['engine_tok_s'] / base:.2f}x, "
                f"{x['overlapped_steps']} overlapped)"
                for m, x in r["engine_ab"].items()))
    for r in rows:   # where an engine step's time goes (forward: launches; sample: waits for the device)
        if "engine_phase_ms" in r:
            print(f"engine phases, ms a step: {r['model'][:28]} b={r['batch']}: "
                  + ", ".join(f"{k} {v:.2f}" for k, v in r["engine_phase_ms"].items() if not k.startswith("last")))


if __name__ == "__main__":
    main()
