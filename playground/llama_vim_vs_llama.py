"""llama.vim's fill-in-the-middle requests to slotserver and to llama-server: the same tokens and text.

    .venv/bin/python playground/llama_vim_vs_llama.py [--threads 2] [--model PATH] [--seeds 4]

llama.vim (autoload/llama.vim, llama#fim) sends `/infill` with `samplers: ["top_k", "top_p",
"infill"]`, top_k 40, top_p 0.99, `n_indent` (the cursor line's indentation), `t_max_prompt_ms` and
`t_max_predict_ms`, `input_extra` chunks and `response_fields`. Here each code snippet, cut at a
cursor inside an indented block, is sent with llama.vim's body and a seed (llama.cpp's mt19937
draws, the same on both), n_predict 64, to llama-server and to slotserver (`--dtype float32`, the
reference mode), one server at a time, one slot each; t_max_predict_ms is set past any run so that
the time rule (clock-dependent) does not decide where an answer ends. Per request: whether the
sampled tokens, the text (with n_indent's cut) and the stop type are identical.
Needs the llama.cpp build (playground/local_server.py: LLAMA_CPP_DIR) and Qwen2.5-Coder-0.5B-Instruct
Q4_K_M at SLOTSERVER_MODELS/qwen/model.gguf or --model (infill_vs_llama.py's model).

Last run (2026-11-27, 2-core host, avx2 avx512_vnni avx512f): 14/16 identical, the n_indent cuts
included ('s += x\n    ', 'return 0;\n', a 25-token method body ended at the dedent). The other
two ("python method", seeds 0 and 1) part at one token where the infill sampler's second threshold
(1 / (text tokens + 1) = 1/3) falls between the engines' probabilities: llama-server " an" 0.357,
slotserver 0.321 (logprobs -1.032 / -1.139; llama.cpp multiplies Q4_K by 8-bit activations,
slotserver's float32 reference by the exact weights), so llama-server keeps " an" and slotserver
drops it; every other token, cut and stop is the same.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from infill_vs_llama import MODEL, server
from local_server import post

# (prefix up to the cursor, suffix from it): the cursor in an indented block
SNIPPETS = {
    "python loop": ("def total(xs):\n    s = 0\n    for x in xs:\n        ", "\n    return s\n\nprint(total([1, 2]))\n"),
    "python method": ("class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, x):\n        ",
                      "\n\n    def pop(self):\n        return self.items.pop()\n"),
    "c function": ("#include <stdio.h>\n\nint square(int x) {\n    ", "\n}\n\nint main(void) {\n    printf(\"%d\\n\", square(3));\n}\n"),
    "js callback": ("const xs = [3, 1, 2];\nxs.forEach((x) => {\n  ", "\n});\nconsole.log(xs);\n"),
}
EXTRA = [{"text": "def helper(v):\n    return v * 2\n", "time": 1732700000.0, "filename": "helpers.py"}]
FIELDS = ["content", "tokens", "stop_type", "timings/predicted_n", "truncated", "tokens_cached"]


def body(prefix: str, suffix: str, seed: int) -> dict:
    """llama.vim's request (its llama#fim, current version), the cursor's line indentation as n_indent."""
    line = prefix.rsplit("\n", 1)[-1]
    return {"input_prefix": prefix[: len(prefix) - len(line)], "input_suffix": suffix, "input_extra": EXTRA,
            "prompt": line, "n_predict": 64, "n_indent": len(line) - len(line.lstrip(" \t")), "top_k": 40,
            "top_p": 0.99, "stream": False, "samplers": ["top_k", "top_p", "infill"], "cache_prompt": True,
            "t_max_prompt_ms": 500, "t_max_predict_ms": 600_000, "response_fields": FIELDS,
            "seed": seed, "return_tokens": True}


def answers(kind: str, model: Path, threads: int, seeds: int) -> list[dict]:
    flags = ["-c", "4096"] + (["--dtype", "float32"] if kind == "slot" else [])
    with server(kind, model, threads, flags) as port:
        return [post(port, "/infill", body(p, s, seed)) for p, s in SNIPPETS.values() for seed in range(seeds)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--model", type=Path, default=MODEL)
    ap.add_argument("--seeds", type=int, default=4)
    args = ap.parse_args()
    llama = answers("llama", args.model, args.threads, args.seeds)
    slot = answers("slot", args.model, args.threads, args.seeds)
    names = [f"{name}, seed {seed}" for name in SNIPPETS for seed in range(args.seeds)]
    same = 0
    for name, a, b in zip(names, llama, slot):
        ok = all(a.get(k) == b.get(k) for k in ("tokens", "content", "stop_type"))
        same += ok
        print(f"  {name:24s} {'==' if ok else '!='}  {a['stop_type']:5s} {a['timings/predicted_n']:3d} tokens  {a['content']!r}")
        if not ok:
            print(f"    slotserver: {b['stop_type']:5s} {b['timings/predicted_n']:3d} tokens  {b['content']!r}")
    print(f"{same}/{len(names)} identical (tokens, text and stop type)")
    return 0 if same == len(names) else 1


if __name__ == "__main__":
    sys.exit(main())
