"""A MoE GGUF (any size, any format) against llama-server on the same file: top-8 and greedy ids.

llama-server (the peer build, f32 KV) completes make_arch_fixtures.py's three prompts greedily with
top-8 log-probs; slotserver's model, as `serve` loads it by default (--dtype auto: float32
activations on the file's GGUF blocks; or --weights dense), is fed prompt + llama's ids (teacher
forcing) and compared: the largest top-8 probability difference and how many steps pick llama's id.
On a quantized file both sides quantize activations to 8 bits their own way, so near-ties differ.

    .venv/bin/python playground/moe_check.py FILE.gguf [--weights q|dense] [--n-predict 12]
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "playground"))
sys.path.insert(0, str(ROOT / "tests"))
import make_arch_fixtures  # noqa: E402

from slotserver.model.model import LlamaModel  # noqa: E402
from slotserver.model.weights import WeightFormat  # noqa: E402
from slotserver.runtime.batch import Batch, SeqChunk  # noqa: E402
from slotserver.runtime.kv_spec import KVSpec  # noqa: E402
from slotserver.runtime.layouts import create_layout, load_layout  # noqa: E402


def compare(model: LlamaModel, rows: list[dict], gaps: list | None = None) -> tuple[float, int, int]:
    """(largest top-8 probability difference, steps whose argmax is llama's id, steps); `gaps`
    collects llama's top-1 to top-2 log-prob gap at each step whose argmax differs."""
    worst, same, total = 0.0, 0, 0
    for r in rows:
        seq = r["prompt_ids"] + r["generated_ids"]
        s = model.spec
        cache = create_layout(load_layout("head_seq_dim"), KVSpec(s.n_layers, 1, 256, s.n_kv_heads, s.head_dim,
                                                                  torch.float32))
        logits = model.forward(Batch.build([SeqChunk(0, 0, seq, all_logits=True)]), cache)
        lp = logits[len(r["prompt_ids"]) - 1: len(seq) - 1].log_softmax(-1)
        for i, step in enumerate(r["steps"]):
            ids = torch.tensor([t for t, _ in step["top"]])
            want = torch.tensor([p for _, p in step["top"]]).exp()
            worst = max(worst, float((lp[i, ids].exp() - want).abs().max()))
        lp[:, r["banned"]] = -float("inf")
        for i, (a, b) in enumerate(zip(lp.argmax(-1).tolist(), r["generated_ids"])):
            same += int(a == b)
            if a != b and gaps is not None:
                gaps.append(r["steps"][i]["top"][0][1] - r["steps"][i]["top"][1][1])
        total += len(r["generated_ids"])
    return worst, same, total


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("gguf", type=Path)
    ap.add_argument("--weights", default="q", choices=("q", "dense"))
    ap.add_argument("--n-predict", type=int, default=12)
    args = ap.parse_args()
    make_arch_fixtures.N_PREDICT = args.n_predict
    rows = make_arch_fixtures.run_llama(args.gguf)
    args.gguf.with_suffix(".log").unlink(missing_ok=True)
    model = LlamaModel.load(args.gguf, torch.float32, max_pos=256, fmt=WeightFormat(args.weights))
    differ: list[float] = []
    worst, same, total = compare(model, rows, differ)
    tops = sorted(math.exp(st["top"][0][1]) for r in rows for st in r["steps"])
    gaps = sorted(st["top"][0][1] - st["top"][1][1] for r in rows for st in r["steps"])
    print(f"{args.gguf.name} --weights {args.weights}: top-8 max |dp| {worst:.2e}, argmax = llama.cpp's greedy id "
          f"on {same}/{total} steps (llama's top-1 probability: median {tops[len(tops) // 2]:.2e}; log-prob gap "
          f"top-1 to top-2: median {gaps[len(gaps) // 2]:.3f}, smallest {gaps[0]:.4f}; at the steps that differ: "
          f"{', '.join(f'{g:.3f}' for g in sorted(differ))})")


if __name__ == "__main__":
    main()
