"""slotserver's POST /infill against llama-server's: the same prompt tokens, the same greedy text.

    .venv/bin/python playground/infill_vs_llama.py [--threads 2] [--model PATH]

Needs a llama.cpp build and Qwen2.5-Coder-0.5B-Instruct Q4_K_M outside the repo (local_server.py:
LLAMA_CPP_DIR, SLOTSERVER_MODELS/qwen/model.gguf, or --model), a model with FIM tokens (pre/suf/mid, repo
name, file separator). Three server set-ups (each server alone, one at a time, -np 1), each request
greedy (temperature 0, n_predict 16, return_tokens):
  A: -c 4096 -b 2048           the suite's two requests, no prompt, mixed ids in the prefix, ...
  B: -c 1024 -b 256 -n 200     long prefix/suffix/extra: cut to 192 / 62-len(prompt) / 368 tokens
  C: -c 4096 --spm-infill      suffix before prefix
Per request it prints whether
  ids   the prompt token ids are llama-server's: slotserver's layout (infill_prompt.py, computed
        here in-process) is sent to llama-server's /completion right after its own /infill; it
        reuses all but the last token from its cache (timings.cache_n = n - 1) only if its own
        prompt began with exactly those tokens, and its tokens_evaluated says it had n of them
        (both end with FIM_MID); the same check on slotserver shows slotserver served that layout
  text  both responses echo the same `prompt` text
  gen   the greedy tokens and content are identical
        (where not: both servers' two likeliest tokens at the first difference, a near tie or not)
Last run (2 shared cores): ids and text identical in all 9 requests, greedy text in 8; B's "long, cut,
with prompt" differs from its first token, a near tie the engines order differently (llama-server
' x' -1.462 / ' f' -1.537, slotserver ' f' -1.413 / ' x' -1.592; the same with -b 1024 on both).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

from local_server import MODELS, PEER, free_port, post, wait_healthy

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
MODEL = MODELS / "qwen/model.gguf"

PREFIX = "#include <cstdio>\n#include \"llama.h\"\n\nint main() {\n"
SUITE = {"input_prefix": PREFIX, "prompt": "    int n_threads = llama_", "input_suffix": "}\n"}
EXTRA = [{"filename": "llama.h", "text": "LLAMA_API int32_t llama_n_threads();\n"}]
LONG_PREFIX = "".join(f"def f{i}(x):\n    return x * {i} + {i * i}\n\n" for i in range(40))
LONG_SUFFIX = "".join(f"print(f{i}(3))\n" for i in range(60))
LONG_EXTRA = [{"filename": f"mod{k}.py", "text": "".join(f"CONST_{k}_{i} = {i * 7}\n" for i in range(40))}
              for k in range(3)]


def cases(tokenizer) -> dict[str, list[tuple[str, dict]]]:
    """Set-up -> (name, /infill body) pairs; mixed prefixes use ids from the model's vocabulary."""
    ids = tokenizer.encode("def add(a, b):\n", add_special=False)
    return {
        "A": [("suite, no extra", SUITE), ("suite, with extra", {**SUITE, "input_extra": EXTRA}),
              ("no prompt", {"input_prefix": "def fib(n):\n    ", "input_suffix": "\n\nprint(fib(10))\n"}),
              ("mixed ids, chunk without filename, special text",
               {"input_prefix": ["import os\n", *ids, "    return "],
                "input_suffix": ["\n# <|fim_prefix|> stays text\n"],
                "input_extra": [{"text": "x = 1  # café ☕\n"}], "prompt": "a"}),
              ("empty prefix and suffix", {"input_prefix": "", "input_suffix": "", "prompt": "import"})],
        "B": [("long, cut, with prompt", {"input_prefix": LONG_PREFIX, "input_suffix": LONG_SUFFIX,
                                          "input_extra": LONG_EXTRA, "prompt": "def g(x):\n    return"}),
              ("long, cut, no prompt", {"input_prefix": LONG_PREFIX, "input_suffix": LONG_SUFFIX,
                                        "input_extra": LONG_EXTRA})],
        "C": [("spm, suite with extra", {**SUITE, "input_extra": EXTRA}),
              ("spm, no prompt", {"input_prefix": "def fib(n):\n    ", "input_suffix": "\n\nprint(fib(10))\n"})],
    }


SETUPS = {"A": ["-c", "4096", "-b", "2048"], "B": ["-c", "1024", "-b", "256", "-n", "200"],
          "C": ["-c", "4096", "--spm-infill"]}
BUDGETS = {"A": (2048, -1, 4096, False), "B": (256, 200, 1024, False), "C": (2048, -1, 4096, True)}
GREEDY = {"temperature": 0, "n_predict": 16, "return_tokens": True, "cache_prompt": True, "n_probs": 2}


@contextmanager
def server(kind: str, model: Path, threads: int, flags: list[str]):
    """llama-server ("llama") or slotserver ("slot") with one slot; yields its port once healthy."""
    port = free_port()
    common = ["-m", str(model), "-t", str(threads), "-np", "1", "--port", str(port), *flags]
    if kind == "llama":
        cmd, env = [str(PEER / "llama-server"), *common], dict(os.environ, LD_LIBRARY_PATH=str(PEER))
    else:
        cmd, env = [str(ROOT / ".venv/bin/slotserver"), "serve", *common], dict(os.environ)
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    try:
        wait_healthy(port, f"{kind} ({' '.join(cmd)})", proc, timeout_s=180)
        yield port
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def run_setup(kind: str, setup: str, requests: list[tuple[str, dict]], expected: list[list[int]],
              model: Path, threads: int) -> list[dict]:
    """Each /infill answer, plus `cache_n` of a /completion on the expected ids sent right after."""
    out = []
    with server(kind, model, threads, SETUPS[setup]) as port:
        for (_, body), ids in zip(requests, expected):
            r = post(port, "/infill", {**body, **GREEDY})
            check = post(port, "/completion", {"prompt": ids, "n_predict": 1, "temperature": 0, "cache_prompt": True})
            out.append({**r, "check_cache_n": check["timings"]["cache_n"]})
    return out


def report(name: str, ids: list[int], llama: dict, slot: dict) -> bool:
    n = len(ids)
    same_ids = all(x["tokens_evaluated"] == n and x["check_cache_n"] == n - 1 for x in (llama, slot))
    same_text = llama["prompt"] == slot["prompt"]
    same_gen = llama["tokens"] == slot["tokens"] and llama["content"] == slot["content"]
    print(f"  {name:52s} n={n:4d} ids {'==' if same_ids else '!='}  text {'==' if same_text else '!='}  "
          f"gen {'==' if same_gen else '!='}  {llama['content']!r}")
    if not same_ids:
        print(f"    llama evaluated {llama['tokens_evaluated']} cache_n {llama['check_cache_n']}, "
              f"slot evaluated {slot['tokens_evaluated']} cache_n {slot['check_cache_n']}")
    if not same_gen:
        print(f"    slotserver: {slot['content']!r}\n    llama: {llama['tokens']}\n    slot:  {slot['tokens']}")
        at = next(i for i, (a, b) in enumerate(zip(llama["tokens"], slot["tokens"])) if a != b)
        for who, x in (("llama", llama), ("slot", slot)):
            top = x["completion_probabilities"][at]["top_logprobs"]
            print(f"    {who} at token {at}: " + ", ".join(f"{t['token']!r} {t['logprob']:.4f}" for t in top))
    return same_ids and same_text and same_gen


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--model", type=Path, default=MODEL)
    args = ap.parse_args()
    from slotserver.model.gguf_file import GGUFFile
    from slotserver.model.text.tokenizer import Tokenizer
    from slotserver.server.infill_prompt import FimTokens, InfillBudget, format_infill
    from slotserver.server.infill_request import parse_infill

    tokenizer = Tokenizer.from_metadata(GGUFFile.open(args.model).metadata)
    fim, ok = FimTokens.of(tokenizer), True
    for setup, requests in cases(tokenizer).items():
        budget = InfillBudget(*BUDGETS[setup])
        expected = [format_infill(tokenizer, fim, parse_infill(b, tokenizer), budget) for _, b in requests]
        llama = run_setup("llama", setup, requests, expected, args.model, args.threads)
        slot = run_setup("slot", setup, requests, expected, args.model, args.threads)
        print(f"{setup}: {' '.join(SETUPS[setup])}")
        for (name, _), ids, lr, sr in zip(requests, expected, llama, slot):
            ok &= report(name, ids, lr, sr)
    print("all identical" if ok else "DIFFERENCES above")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
