"""The model alone against llama.cpp's own benchmarks, side by side in one run, ratios printed.

Per round, alternating: llama-bench (pp128, tg32) and llama-batched-bench (128-token prompts, 32
generated, 1 / 8 / 32 parallel sequences: its generation speed), then slotserver's model for each
config (cpu_formats.measure: one 128-token prefill; decode steps at batch 1 / 8 / 32, 128 deep).
Medians over rounds; ratio = slotserver / llama.cpp (> 1: slotserver faster). Same threads (-t).

    .venv/bin/python playground/model_vs_llama.py --llama-bin DIR [--model F.gguf] [--rounds 3] [--configs auto:auto]
        [--threads N] [--stat median|best]

--stat best takes each side's best round instead of the median: on a host shared with other work
(load average above the cores), a round that a neighbour's burst hit says little about either side.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
from pathlib import Path

import torch

import cpu_formats

COLS = ("pp128", "tg b=1", "tg b=8", "tg b=32")


def llama_round(bin_dir: Path, model: str, threads: int) -> dict[str, float]:
    bench = subprocess.run([str(bin_dir / "llama-bench"), "-m", model, "-p", "128", "-n", "32", "-t", str(threads),
                            "-r", "2", "-o", "jsonl"], capture_output=True, text=True, check=True)
    rows = [json.loads(line) for line in bench.stdout.splitlines() if line.startswith("{")]
    out = {"pp128": next(r["avg_ts"] for r in rows if r["n_prompt"] == 128 and r["n_gen"] == 0),
           "tg b=1": next(r["avg_ts"] for r in rows if r["n_gen"] == 32 and r["n_prompt"] == 0)}
    batched = subprocess.run([str(bin_dir / "llama-batched-bench"), "-m", model, "-c", "8192", "-b", "2048", "-ub", "512",
                              "-npp", "128", "-ntg", "32", "-npl", "8,32", "-t", str(threads), "--output-format", "jsonl"],
                             capture_output=True, text=True, check=True)
    for r in (json.loads(line) for line in batched.stdout.splitlines() if line.startswith("{")):
        out[f"tg b={r['pl']}"] = r["speed_tg"]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--llama-bin", required=True, type=Path, help="folder with llama-bench and llama-batched-bench")
    ap.add_argument("--model", default=None)
    ap.add_argument("--configs", nargs="+", default=["auto:auto"])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--threads", type=int, default=None, help="threads for both sides (default: torch's)")
    ap.add_argument("--stat", choices=("median", "best"), default="median")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.model:
        cpu_formats.MODEL = os.environ["SLOTSERVER_MODEL"] = args.model
    model, threads = str(cpu_formats.MODEL), torch.get_num_threads()
    loaded = {c: cpu_formats.setup(c) for c in args.configs}
    runs: dict[str, list[dict]] = {"llama.cpp": [], **{c: [] for c in args.configs}}
    for i in range(args.rounds):
        runs["llama.cpp"].append(llama_round(args.llama_bin, model, threads))
        for c in args.configs:
            runs[c].append(cpu_formats.measure(*loaded[c], args.steps))
        print(f"round {i + 1} (load {os.getloadavg()[0]:.1f}): " + "; ".join(
            f"{k} " + " ".join(f"{v[-1][col]:.1f}" for col in COLS) for k, v in runs.items()), flush=True)
    agg = statistics.median if args.stat == "median" else max
    med = {k: {col: agg(r[col] for r in v) for col in COLS} for k, v in runs.items()}
    print(f"model {Path(model).name}, {threads} threads, tokens/s, {args.stat} of {args.rounds} alternating rounds; "
          f"(x) = ratio to llama.cpp (llama-bench pp128 / tg32, llama-batched-bench at 8 and 32)")
    print(f"{'':18}" + "".join(f"{c:>18}" for c in COLS))
    for k, m in med.items():
        print(f"{k:18}" + "".join(f"{m[c]:10.1f} ({m[c] / med['llama.cpp'][c]:4.2f})" for c in COLS))


if __name__ == "__main__":
    main()
