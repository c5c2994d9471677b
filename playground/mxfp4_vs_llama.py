"""A tiny llama written with MXFP4 (or another block type) matrices, served by llama-server and by
slotserver: each step's top-8 log-probabilities and greedy ids, teacher-forced on llama-server's
greedy completions (make_arch_fixtures.py's prompts and request).

    .venv/bin/python playground/mxfp4_vs_llama.py [--type MXFP4] [--out /tmp/mxfp4chk]

Both sides quantize the activations to 8 bits for these matmuls (llama.cpp's q8_0 with a float16
scale, slotserver's with a float32 one), so on a tiny random model they differ by about what the
8-bit step costs; run it with --type Q4_0 for the yardstick. Measured (2-core AVX-512 host):
MXFP4 top-8 within 0.12 (blocks) / 0.15 (dequantized), greedy 35/36; Q4_0 0.15 / 0.10, 30/36.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import gguf
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
import make_arch_fixtures as arch  # noqa: E402
from tiny_gguf import write_tiny_gguf  # noqa: E402

from slotserver.model.model import LlamaModel  # noqa: E402
from slotserver.model.weights import WeightFormat  # noqa: E402
from slotserver.runtime.batch import Batch, SeqChunk  # noqa: E402
from slotserver.runtime.kv_spec import KVSpec  # noqa: E402
from slotserver.runtime.layouts import create_layout, load_layout  # noqa: E402


def compare(model: LlamaModel, rows: list[dict]) -> tuple[float, int, int]:
    """(largest |log-prob difference| over llama-server's top-8, greedy agreements, steps)."""
    worst, agree, steps = 0.0, 0, 0
    s = model.spec
    for r in rows:
        seq = r["prompt_ids"] + r["generated_ids"]
        cache = create_layout(load_layout("seq_head_dim"), KVSpec(s.n_layers, 1, 256, s.n_kv_heads, s.head_dim, model.dtype))
        logits = model.forward(Batch.build([SeqChunk(0, 0, seq, all_logits=True)]), cache)
        lp = torch.log_softmax(logits[len(r["prompt_ids"]) - 1: len(seq) - 1].double(), -1)
        for i, step in enumerate(r["steps"]):
            worst = max([worst] + [abs(float(lp[i, t]) - v) for t, v in step["top"]])
            agree, steps = agree + int(int(lp[i].argmax()) == step["id"]), steps + 1
    return worst, agree, steps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--type", default="MXFP4", help="the matrices' GGML type")
    ap.add_argument("--out", type=Path, default=Path("/tmp/mxfp4chk"))
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    qtype = gguf.GGMLQuantizationType[args.type]
    path = write_tiny_gguf(args.out / f"{args.type}.gguf", seed=5, **(arch.SMALL | dict(
        tensor_type=qtype, d_model=64, n_heads=4, n_kv_heads=2, d_ff=128)))
    rows = arch.run_llama(path)
    for kind in ("dense", "q"):
        worst, agree, steps = compare(LlamaModel.load(path, torch.float32, max_pos=256, fmt=WeightFormat(kind)), rows)
        print(f"{args.type} --weights {kind}: top-8 within {worst:.4f}, greedy {agree}/{steps}")


if __name__ == "__main__":
    main()
