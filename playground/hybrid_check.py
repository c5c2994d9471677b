"""A big random hybrid model (make_moe_fixtures.py NAME --size big, and its llama-quantize copies)
against llama-server on the same file: the largest top-8 probability difference and how often our
argmax is llama-server's greedy id, over make_arch_fixtures.py's three prompts: prefilled at once
(the recurrent kernels' scan over each prompt: kernels/delta_net_step.py, short_conv_step.py), then
decoded one token a step, the three together.

    .venv/bin/python playground/hybrid_check.py FILE.gguf [dense|q ...]   (default: q, float32 and bf16)
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from make_arch_fixtures import run_llama  # noqa: E402
import test_arch_fixtures as fixtures  # noqa: E402
from slotserver.model.model import LlamaModel  # noqa: E402
from slotserver.model.weights import WeightFormat  # noqa: E402


def compare(logits: list[torch.Tensor], rows: list[dict]) -> tuple[float, int, int]:
    """(largest top-8 probability difference, argmax = llama's greedy id count, steps)."""
    worst, agree, n = 0.0, 0, 0
    for lp, r in zip(logits, rows):
        lp = lp.float().log_softmax(-1)
        for i, step in enumerate(r["steps"]):
            worst = max(worst, fixtures.top8_diff(lp[i], step))
            agree, n = agree + int(int(lp[i].argmax()) == step["id"]), n + 1
    return worst, agree, n


def main() -> None:
    path, kinds = Path(sys.argv[1]), sys.argv[2:]
    rows = run_llama(path)
    forms = [(torch.float32, k) for k in kinds] or [(torch.float32, "q"), (torch.bfloat16, "q")]
    for dtype, kind in forms:
        model = LlamaModel.load(path, dtype, max_pos=fixtures.N_CTX, fmt=WeightFormat(kind))
        for how, logits in (("prefilled", fixtures._prefilled(model, rows)),
                            ("decoded", fixtures._decoded(model, rows, "seq_head_dim"))):
            worst, agree, n = compare(logits, rows)
            print(f"{path.name} {dtype} {kind} {how}: top-8 max difference {worst:.3g}, "
                  f"argmax = llama's greedy id {agree}/{n}")


if __name__ == "__main__":
    main()
