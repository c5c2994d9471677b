"""Launches of one decode step, per layer: what a CUDA decode step runs, and what it costs.

A decode step on a GPU is launch-bound (docs/gpu.md, second round: ~16 launches a layer at 2-5 us
each), so the number of launches is the number to bring down. This lists them:

- every aten op that launches work (views, `empty` and other metadata ops left out) and every
  Triton kernel launch of one eager decode step, in order, grouped by name with their count per
  step and per layer;
- on CUDA (`--device cuda`), also torch.profiler's list of the CUDA kernels of one step replayed
  from its CUDA graph, with their device time (what the served step runs; cuBLAS's own kernels
  included, e.g. whether a bias rides in its epilogue or costs a launch of its own).

`--compare` runs it twice: the Triton body as served (model/lean_step.py) and the unfused body
(rms_norm's `add`/`out_dtype` fusions hidden), so the saving shows per layer. `--gemv` adds the
fused-GEMV body (model/gemv_step.py, ModelConfig.fused_gemv: norm, bias, rope, gate and residual
add inside kernels/gemv.py's matmuls) as a third variant, "gemv".

    python playground/decode_launches.py --device cuda --compare --out DIR   # Qwen2.5-0.5B shape, 4 layers
    python playground/decode_launches.py --dry-run --compare --json          # CPU, tiny, interpreted
    python playground/decode_launches.py --device cuda --compare --gemv --out DIR   # + the fused-GEMV body
    (--device cpu is a dry run: the CPU serves another body, this emulates the CUDA one)

A dry run (`--dry-run`, the CPU) runs the same code on CPU tensors with the Triton kernels under
TRITON_INTERPRET=1 (re-executing itself with it set) on a tiny qwen2 model: the launch list is the
CUDA path's, the times are not measured. `--budget-s` bounds the whole run (the profile is skipped
when too little is left).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "playground")]

import torch  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

# aten ops that launch nothing on a device: allocation and metadata
NO_LAUNCH = {"empty", "empty_strided", "empty_like", "detach", "alias", "lift_fresh", "_unsafe_view",
             "sym_size", "sym_stride", "sym_numel", "is_same_size", "_has_compatible_shallow_copy_type"}


class LaunchCounter(TorchDispatchMode):
    """Names, in order, of the aten ops that launch work and of the Triton kernels launched while
    active. A Triton launch's own host-side tensor work (the interpreter's copies) is not counted."""

    def __init__(self) -> None:
        super().__init__()
        self.names: list[str] = []
        self._paused = 0
        self._undo = None

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = func.overloadpacket.__name__
        if not self._paused and name not in NO_LAUNCH and not (func.is_view and _aliases(out, args)):
            self.names.append(f"aten.{name}")
        return out

    def __enter__(self):
        from slotserver.runtime import native

        undo_triton = _hook_triton(self)
        native_calls = native.recording(self._native)   # the CPU's C calls (the dry run's K/V write)
        native_calls.__enter__()
        self._undo = lambda: (native_calls.__exit__(None, None, None), undo_triton())
        return super().__enter__()

    def __exit__(self, *exc):
        self._undo()
        return super().__exit__(*exc)

    def _native(self, fn, replay, args):
        """A C call of the CPU (where CUDA launches a kernel: kv_write_rows is kv_rows_triton's)."""
        self.names.append(f"native.{fn.__name__}")
        return fn(*args)


def _aliases(out, args) -> bool:
    """Whether a view-like op's result shares its input's memory (a view: no launch). Under
    inference_mode `aten.to` arrives whole, marked a view, and copies only when the dtype changes."""
    src = next((a for a in args if isinstance(a, torch.Tensor)), None)
    return (isinstance(out, torch.Tensor) and src is not None
            and out.untyped_storage().data_ptr() == src.untyped_storage().data_ptr())


def _hook_triton(counter: LaunchCounter):
    """Wrap triton's launch (compiled JITFunction.run, or the interpreter's) to record each kernel."""
    from triton.runtime import interpreter, jit

    classes = [jit.JITFunction, interpreter.InterpretedFunction]
    saved = {cls: cls.run for cls in classes}

    def wrap(orig):
        def run(self, *args, **kwargs):
            if not kwargs.get("warmup"):
                counter.names.append(f"triton.{getattr(self, 'fn', self).__name__}")
            counter._paused += 1
            try:
                return orig(self, *args, **kwargs)
            finally:
                counter._paused -= 1
        return run

    for cls, orig in saved.items():
        cls.run = wrap(orig)
    return lambda: [setattr(cls, "run", orig) for cls, orig in saved.items()]


def load(path: Path, device: str, unfused: bool, dtype: torch.dtype = torch.bfloat16, gemv: bool = False):
    """The model as the CUDA path serves it (bf16, dense weights, Triton kernels), on `device`;
    `unfused`: rms_norm's add/out_dtype fusions hidden from the model (the unfused body).
    dtype: the CPU's compute dtype (tests/test_lean_step.py compares float32 floats).
    gemv: decode steps on the fused GEMV body (model/gemv_step.py; ModelConfig.fused_gemv)."""
    from slotserver.model.config import ModelConfig
    from slotserver.model.model import LlamaModel
    from slotserver.model.weights import WeightFormat
    from slotserver.runtime.kernel_set import KernelSet

    if device == "cuda":
        from slotserver.model.bundle import ModelBundle

        model = ModelBundle.load(ModelConfig(path, device="cuda", dtype="auto", max_ctx=4096, fused_gemv=gemv)).model
    else:
        model = LlamaModel.load(path, dtype, kernels=KernelSet.load(impl="triton"), fmt=WeightFormat("dense"))
        for lin in model.weights.matmuls():   # oneDNN's blocked copy is CPU-only: the plain matrix, as on CUDA
            if getattr(lin, "packed", None) is not None:
                lin.dense, lin.packed = lin.packed.to_dense(), None
        model.set_step_graphs(False)
        model.fused_gemv = gemv
    if unfused:
        ks = model.kernels
        ks.fuses = {**ks.fuses, "rms_norm": ks.fuses["rms_norm"] - {"add", "out_dtype"}}
    return model


def decode_batch(model, batch: int, ctx: int, layout: str = "head_seq_dim", together: bool = False):
    """A cache with `batch` streams prefilled to `ctx` tokens, and the next decode step's batch.
    `together`: one prefill forward for every stream (the tests' interpreted Triton pays per
    forward); else one a stream (a card's large batch x ctx stays a stream's activations)."""
    from slotserver.engine.kv_cache import KVCache
    from slotserver.runtime.batch import Batch, SeqChunk
    from slotserver.runtime.kv_spec import KVSpec

    s, dev = model.spec, model.device
    cache = KVCache.create(layout, KVSpec(s.n_layers, batch, ctx + 8, s.n_kv_heads, s.head_dim, model.dtype,
                                                  device=dev))
    vocab = s.vocab_size
    toks = [(100 + 7 * i) % vocab for i in range(ctx)]
    chunks = [SeqChunk(b, 0, toks, logits=False) for b in range(batch)]
    for group in [chunks] if together else [[c] for c in chunks]:
        model.forward(Batch.build(group, dev), cache)
    return cache, Batch.build([SeqChunk(b, ctx, [(ctx + b) % vocab]) for b in range(batch)], dev)


def count_step(model, batch: int, ctx: int, layout: str = "head_seq_dim") -> dict:
    """The launches of one eager decode step: per name, per step and per layer, in first-seen order."""
    cache, step = decode_batch(model, batch, ctx, layout)
    model.set_step_graphs(False)                   # eager: every launch goes through Python
    model.forward(step, cache)                     # warm: Triton compiles outside the count
    with LaunchCounter() as counter:
        model.forward(step, cache)
    model.set_step_graphs(model.device == "cuda")  # the dry run's CPU keeps none (Triton kernels)
    n = Counter(counter.names)
    layers = model.spec.n_layers
    return {"launches_per_step": len(counter.names), "per_layer": round(len(counter.names) / layers, 2),
            "n_layers": layers, "ops": {k: n[k] for k in dict.fromkeys(counter.names)}}


def profile_replay(model, batch: int, ctx: int, layout: str = "head_seq_dim") -> dict:
    """CUDA kernels of one decode step replayed from its CUDA graph (torch.profiler), with device time."""
    from torch.profiler import ProfilerActivity, profile

    cache, step = decode_batch(model, batch, ctx, layout)
    for _ in range(3):                             # eager + capture, then a replay
        model.forward(step, cache)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        model.forward(step, cache)
        torch.cuda.synchronize()
    rows = []
    for e in prof.key_averages():
        us = getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0.0)
        if us > 0 and e.key != "cudaGraphLaunch":
            rows.append({"kernel": e.key[:90], "count": e.count, "us": round(us, 1)})
    rows.sort(key=lambda r: -r["us"])
    return {"kernels": rows, "launches": sum(r["count"] for r in rows), "kernel_us": round(sum(r["us"] for r in rows), 1)}


def model_path(a: argparse.Namespace, tmp: Path) -> Path:
    if a.model:
        return a.model
    if a.dry_run:
        from tiny_gguf import write_tiny_gguf

        return write_tiny_gguf(tmp / "tiny-qwen2.gguf", arch="qwen2", qkv_bias=True, n_layers=2, d_model=64)
    import dataclasses

    import shape_model

    name = f"{a.shape}-{a.layers}l"   # per-layer launches and times do not depend on the depth
    shape_model.SHAPES[name] = dataclasses.replace(shape_model.SHAPES[a.shape], n_layers=a.layers)
    return shape_model.write(name, "BF16", tmp / f"{name}-BF16.gguf")


def show(name: str, r: dict) -> None:
    print(f"\n== {name}: {r['launches_per_step']} launches a step, {r['per_layer']} a layer ({r['n_layers']} layers)")
    for op, n in r["ops"].items():
        print(f"  {op:48} {n:5}  ({n / r['n_layers']:.2f} a layer)")
    if "replay" in r:
        p = r["replay"]
        print(f"  replayed from its CUDA graph: {p['launches']} kernels, {p['kernel_us']} us of kernel time")
        for k in p["kernels"][:25]:
            print(f"    {k['kernel']:70} x{k['count']:<4} {k['us']:9.1f} us")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model", nargs="?", type=Path, help="a GGUF (default: a random-weight --shape model, BF16)")
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    p.add_argument("--dry-run", action="store_true", help="CPU, tiny qwen2 model, Triton interpreted")
    p.add_argument("--shape", default="qwen2.5-0.5b")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--ctx", type=int, default=512)
    p.add_argument("--layout", default="head_seq_dim", help="the KV layout (paged ones replay too)")
    p.add_argument("--compare", action="store_true", help="also the unfused body")
    p.add_argument("--gemv", action="store_true", help="also the fused-GEMV body (model/gemv_step.py)")
    p.add_argument("--layers", type=int, default=4, help="layers of the --shape model (a smaller file to write)")
    p.add_argument("--budget-s", type=float, default=float(os.environ.get("PART_S", 305)) - 5,
                   help="seconds for the whole run (default: gpu_check's PART_S less 5, else 300)")
    p.add_argument("--json", action="store_true", help="print the result as one JSON line last")
    p.add_argument("--out", type=Path)
    a = p.parse_args()
    if a.dry_run or a.device == "cpu":   # the CPU only emulates the CUDA path: tiny and interpreted
        a.dry_run, a.device, a.ctx = True, "cpu", min(a.ctx, 8)
        if os.environ.get("TRITON_INTERPRET") != "1":   # triton fixes interpret-or-compile at import
            os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, "TRITON_INTERPRET": "1"})
    t0, out = time.monotonic(), {}
    with tempfile.TemporaryDirectory() as tmp:
        path = model_path(a, Path(tmp))
        for variant in ("lean",) + (("unfused",) if a.compare else ()) + (("gemv",) if a.gemv else ()):
            if time.monotonic() - t0 > a.budget_s:
                print(f"{variant}: skipped, past --budget-s")
                break
            model = load(path, a.device, variant == "unfused", gemv=variant == "gemv")
            out[variant] = count_step(model, a.batch, a.ctx, a.layout)
            if a.device == "cuda" and time.monotonic() - t0 < a.budget_s - 20:
                out[variant]["replay"] = profile_replay(model, a.batch, a.ctx, a.layout)
            show(variant, out[variant])
            del model
    if a.out:
        a.out.mkdir(parents=True, exist_ok=True)
        (a.out / "decode_launches.json").write_text(json.dumps(out, indent=1))
    if a.json:
        print(json.dumps(out))


if __name__ == "__main__":
    main()
