"""The device sampler against today's copy + host sampler, per batch size, on a real vocabulary.

Issue 34: on `--device cuda` the sampler chain runs where the logits are and only ids and the
requested probabilities come back. This times one step's sampling both ways on the same logits
(float32, [batch, vocab] on the device, as the model leaves them):
  device  StepSampling on the device logits: slotserver/model/sampling/device.py (one small upload,
          the chain on the GPU, one [batch, 4 + 2n] download);
  host    what a step did before: `logits.cpu()` (39 MB at batch 64 of 151936) + the host Sampler.
Cases: greedy with a repeat penalty over a 64-token history; top_k 40 / top_p 0.95 / min_p 0.05 /
temperature 0.8 (llama-server's defaults); the same with n_probs 5; the same with a grammar mask
on every row (10% of the vocabulary allowed). Each time is the median of --reps calls after two
warm-ups, the device synchronized before each call (the call itself ends with its download).
On CUDA, "behind a forward" times the same calls queued behind a 1 ms kernel (torch.cuda._sleep),
as a served step queues its sampling behind the forward's graph: the device path's launches then
overlap the GPU's work, the host path waits for it; it prints the time past that 1 ms.

    PYTHONPATH=. python playground/gpu_sampling_bench.py --device cuda --budget-s 60 [--out DIR]
    PYTHONPATH=. python playground/gpu_sampling_bench.py --dry-run            # CPU, tiny: checks the script

--device cpu runs the device sampler on CPU tensors (its numbers say nothing about a GPU). Prints
one line per case and batch, then a summary; with --out, DIR/gpu_sampling_bench.{txt,json}.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from slotserver.engine.step_sampling import StepSampling  # noqa: E402
from slotserver.model.sampling.sampler import SamplingParams, SequenceRng  # noqa: E402

DEFAULTS = dict(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05)
CASES = {
    "greedy+penalty": (SamplingParams(temperature=0.0, repeat_penalty=1.1), False),
    "top_k/top_p/temp": (SamplingParams(**DEFAULTS), False),
    "n_probs=5": (SamplingParams(**DEFAULTS, n_probs=5), False),
    "grammar": (SamplingParams(**DEFAULTS), True),
}


def sync(dev: str) -> None:
    if dev == "cuda":
        torch.cuda.synchronize()


def median_ms(fn, dev: str, reps: int) -> float:
    for _ in range(2):
        fn()
    times = []
    for _ in range(reps):
        sync(dev)
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


def sleep_cycles(ms: float) -> int:
    """GPU clock cycles that torch.cuda._sleep spins for about `ms` milliseconds (calibrated)."""
    n = 10_000_000
    torch.cuda.synchronize()
    t = time.perf_counter()
    torch.cuda._sleep(n)
    torch.cuda.synchronize()
    return int(n * ms / ((time.perf_counter() - t) * 1e3))


def behind_forward_ms(fn, cycles: int, ms: float, reps: int) -> float:
    """Median time of fn queued behind a ~`ms` kernel, less `ms`: what a step pays after its forward."""
    def step():
        torch.cuda._sleep(cycles)
        fn()
    return median_ms(step, "cuda", reps) - ms


def step_inputs(batch: int, vocab: int, dev: str, params: SamplingParams, grammar: bool, seed: int):
    gen = torch.Generator().manual_seed(seed)
    logits = (3 * torch.randn(batch, vocab, generator=gen)).to(dev)          # [batch, vocab] float32
    r = random.Random(seed)
    seqs = [SimpleNamespace(params=params, rng=SequenceRng(i), tokens=[r.randrange(vocab) for _ in range(64)],
                            reasoning=None) for i in range(batch)]
    plan = SimpleNamespace(chunks=[SimpleNamespace(sample=True, seq=s, draft=()) for s in seqs])
    allowed = torch.rand(batch, vocab, generator=gen) < 0.1 if grammar else None
    return logits, plan, allowed


def run_case(name: str, batch: int, vocab: int, dev: str, reps: int) -> dict:
    params, grammar = CASES[name]
    logits, plan, allowed = step_inputs(batch, vocab, dev, params, grammar, seed=batch)
    device_path = StepSampling(vocab, on_device=True)      # on CUDA logits, what service runs
    host_path = StepSampling(vocab, on_device=False)       # logits.cpu() + the host Sampler
    t_dev = median_ms(lambda: device_path.sample(plan, logits, allowed), dev, reps)
    t_host = median_ms(lambda: host_path.sample(plan, logits.cpu(), allowed), dev, reps)
    t_copy = median_ms(lambda: logits.cpu(), dev, reps)
    row = dict(case=name, batch=batch, vocab=vocab, device_ms=t_dev, host_ms=t_host, copy_ms=t_copy,
               speedup=t_host / t_dev)
    if dev == "cuda":
        cycles = sleep_cycles(1.0)
        row["device_behind_ms"] = behind_forward_ms(lambda: device_path.sample(plan, logits, allowed), cycles, 1.0,
                                                    reps)
        row["host_behind_ms"] = behind_forward_ms(lambda: host_path.sample(plan, logits.cpu(), allowed), cycles, 1.0,
                                                  reps)
    return row


def line(r: dict) -> str:
    text = (f"{r['case']:<17} b={r['batch']:<3} device {r['device_ms']:7.3f} ms   copy+host {r['host_ms']:7.3f} ms "
            f"(copy alone {r['copy_ms']:6.3f})   x{r['speedup']:.1f}")
    if "device_behind_ms" in r:
        text += f"   behind a forward: device {r['device_behind_ms']:6.3f} / copy+host {r['host_behind_ms']:6.3f} ms"
    return text


def summary(rows: list[dict]) -> list[str]:
    out = ["summary (copy+host / device, per batch):"]
    for name in CASES:
        got = [r for r in rows if r["case"] == name]
        if got:
            out.append(f"  {name:<17} " + "  ".join(f"b={r['batch']}: x{r['speedup']:.1f}" for r in got))
            if "device_behind_ms" in got[0]:
                out.append(f"  {'  behind a forward':<17} " + "  ".join(
                    f"b={r['batch']}: x{r['host_behind_ms'] / max(r['device_behind_ms'], 1e-3):.1f}" for r in got))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--dry-run", action="store_true", help="CPU, vocab 4096, batches 1 and 8, 2 reps")
    ap.add_argument("--budget-s", type=float, default=60.0, help="stop starting new cases after this")
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument("--batches", default="1,8,32,64")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()
    dev, vocab, batches, reps = a.device, a.vocab, [int(b) for b in a.batches.split(",")], a.reps
    if a.dry_run:
        dev, vocab, batches, reps = "cpu", 4096, [1, 8], 2
    if dev == "cuda" and not torch.cuda.is_available():
        print("no CUDA device (use --device cpu or --dry-run)")
        return 2
    name = torch.cuda.get_device_name(0) if dev == "cuda" else "cpu"
    print(f"gpu_sampling_bench: {name}, torch {torch.__version__}, vocab {vocab}, {reps} reps, "
          f"{torch.get_num_threads()} host threads")
    t0, rows = time.perf_counter(), []
    for case in CASES:
        for b in batches:
            if time.perf_counter() - t0 > a.budget_s:
                print(f"{case} b={b}: skipped (budget of {a.budget_s:.0f} s spent)")
                continue
            try:
                rows.append(run_case(case, b, vocab, dev, reps))
                print(line(rows[-1]), flush=True)
            except Exception as e:   # one failing case prints a line; the others still run
                print(f"{case} b={b}: FAILED {type(e).__name__}: {e}", flush=True)
    text = summary(rows)
    print("\n".join(text))
    if a.out:
        a.out.mkdir(parents=True, exist_ok=True)
        (a.out / "gpu_sampling_bench.json").write_text(json.dumps(dict(device=name, rows=rows), indent=1))
        (a.out / "gpu_sampling_bench.txt").write_text("\n".join([line(r) for r in rows] + text) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
