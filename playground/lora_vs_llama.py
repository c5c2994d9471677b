"""slotserver's LoRA adapters against llama-server's on the same files.

    .venv/bin/python playground/lora_vs_llama.py [--steps 16]

Needs the llama.cpp peer (local_server.py: LLAMA_CPP_DIR). Writes tiny random float32 models and a
random adapter for each (tests/tiny_gguf.py, tests/tiny_lora.py): llama (separate q/k/v, an
untied output matmul the adapter also changes, alpha 8 on rank 4: factor 2) and qwen2 (neox rope,
q/k/v biases). Both servers start with `--lora-scaled ADAPTER:0.7`, `-np 2`, float32 (slotserver
`--dtype float32`; llama-server `-fa off`; both an f32 KV cache) and get the same requests in the
same order: greedy /completion of three token prompts with n_probs 5, with the server's scale, with
a request's `lora` at 0 and at 1.3, and after `POST /lora-adapters` at 0.25. Each server runs the
list twice, with `cache_prompt` false and true. Printed per case, for three comparisons
(llama-server against slotserver without prompt caching; each server cached against not): for
how many steps the greedy tokens are equal, and the largest difference of the top-5 probabilities
over the steps whose entries name the same tokens (llama-server has no entry for a token that ends
half a UTF-8 character; the steps after it are not compared).
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path

from local_server import PEER, free_port, post, wait_healthy

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from tiny_gguf import tiny_vocab, tiny_weights, write_tiny_gguf  # noqa: E402
from tiny_lora import layer_names, random_pairs, write_adapter  # noqa: E402

MODELS = {"llama": (dict(arch="llama", tied_embeddings=False), 8.0, True),
          "qwen2": (dict(arch="qwen2", qkv_bias=True), 0.0, False)}
PROMPTS = [[5, 77, 300, 12, 9, 41, 250, 3], [100, 101, 102], list(range(40, 70))]
CASES = [("server scale 0.7", None, None), ("request lora 0", [{"id": 0, "scale": 0.0}], None),
         ("request lora 1.3", [{"id": 0, "scale": 1.3}], None), ("POST scale 0.25", None, [{"id": 0, "scale": 0.25}])]


def files(folder: Path, name: str) -> tuple[Path, Path]:
    kw, alpha, output = MODELS[name]
    w = tiny_weights(vocab_size=len(tiny_vocab()[0]), **{k: v for k, v in kw.items() if k != "arch"})
    pairs = random_pairs(w, layer_names(2, output=output), seed=3)
    return (write_tiny_gguf(folder / f"{name}.gguf", ctx_len=512, **kw, **{"tokenizer.ggml.pre": "default"}),
            write_adapter(folder / f"{name}-lora.gguf", kw["arch"], pairs, alpha))


def start(which: str, model: Path, adapter: Path, port: int) -> subprocess.Popen:
    common = ["-m", str(model), "--port", str(port), "-np", "2", "-c", "1024", "--lora-scaled", f"{adapter}:0.7",
              "-t", "2"]
    if which == "llama":
        cmd = [str(PEER / "llama-server"), *common, "-fa", "off", "-ctk", "f32", "-ctv", "f32", "--no-warmup"]
    else:
        cmd = [str(ROOT / ".venv/bin/slotserver"), "serve", *common, "--dtype", "float32", "-ctk", "f32", "-ctv", "f32"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_healthy(port, which, proc)
    return proc


def run_cases(port: int, steps: int, cache: bool) -> list:
    out = []
    for _, lora, posted in CASES:
        if posted is not None:
            req = urllib.request.Request(f"http://127.0.0.1:{port}/lora-adapters", json.dumps(posted).encode(),
                                         {"Content-Type": "application/json"})
            urllib.request.urlopen(req).read()
        for prompt in PROMPTS:
            body = {"prompt": prompt, "n_predict": steps, "temperature": 0, "n_probs": 5, "return_tokens": True,
                    "cache_prompt": cache, **({"lora": lora} if lora else {})}
            out.append(post(port, "/completion", body))
    return out


def aligned(a: dict, b: dict) -> list[tuple[dict, dict]]:
    """Pairs of the two answers' top-5 probabilities, step by step, up to where their entries stop
    naming the same tokens: llama-server gives one entry per completed piece of text, so a token
    ending half a UTF-8 character has none and the entries after it are not the same steps."""
    pairs = []
    for x, y in zip(a["completion_probabilities"], b["completion_probabilities"]):
        if x["id"] != y["id"]:
            break
        pairs.append(tuple({t["id"]: math.exp(t["logprob"]) for t in e["top_logprobs"]} for e in (x, y)))
    return pairs


def compare(name: str, what: str, xs: list, ys: list) -> None:
    for i, (a, b) in enumerate(zip(xs, ys)):
        case, prompt = CASES[i // len(PROMPTS)][0], i % len(PROMPTS)
        steps = next((j for j, (x, y) in enumerate(zip(a["tokens"], b["tokens"])) if x != y), len(a["tokens"]))
        diff = max((abs(pa[t] - pb[t]) for pa, pb in aligned(a, b) for t in set(pa) & set(pb)), default=0.0)
        print(f"{name:6} {what:28} {case:17} prompt {prompt}: greedy tokens equal for {steps:2} of "
              f"{len(a['tokens'])}, top-5 probabilities within {diff:.1e} ({len(aligned(a, b))} steps)")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=16)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        for name in MODELS:
            model, adapter = files(Path(tmp), name)
            answers = {}
            for which in ("llama", "slotserver"):
                for cache in (False, True):
                    port = free_port()
                    proc = start(which, model, adapter, port)
                    try:
                        answers[which, cache] = run_cases(port, args.steps, cache)
                    finally:
                        proc.terminate()
                        proc.wait()
            compare(name, "llama-server vs slotserver", answers["llama", False], answers["slotserver", False])
            compare(name, "slotserver: cached vs not", answers["slotserver", True], answers["slotserver", False])
            compare(name, "llama-server: cached vs not", answers["llama", True], answers["llama", False])
    return 0


if __name__ == "__main__":
    sys.exit(main())
