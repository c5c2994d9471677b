"""What a LoRA adapter costs: decode tok/s with and without one, slotserver against llama-server.

    .venv/bin/python playground/lora_bench.py [--rank 16] [--rounds 3] [--model FILE]

A random adapter of the model's shapes (rank `--rank`, alpha 2 x rank, float32 as
convert_lora_to_gguf.py writes by default) on every attention and FFN matmul of every layer. Each
server (slotserver `--dtype auto`, its default serving path; llama-server, both `-t 2 -np 8`) is
started without the adapter and with `--lora` (scale 1), and gets B concurrent /completion requests
of a 128-token prompt decoding 64 tokens (ignore_eos); decode tok/s = the sum of the requests'
`timings.predicted_per_second`. Servers alternate (other work on the host slows both alike); the
best of `--rounds` is printed, with the adapter's cost on each side and slotserver / llama-server.
(Not llama-batched-bench: it loads no adapter, whatever `--lora` says.)
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from concurrent.futures import ThreadPoolExecutor

from local_server import PEER, free_port, post, wait_healthy

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from tiny_lora import TARGETS, write_adapter  # noqa: E402

from slotserver.model.default_model import default_model_path  # noqa: E402
from slotserver.model.gguf_file import GGUFFile  # noqa: E402

BATCHES = (1, 8)
PROMPT, TOKENS = 128, 64


def adapter(model: Path, out: Path, rank: int) -> Path:
    f = GGUFFile.open(model)
    rng = np.random.default_rng(0)
    pairs = {}
    for name, info in f.tensors.items():
        if name.startswith("blk.") and name.split(".")[2] in TARGETS and name.endswith(".weight"):
            n_out, n_in = info.shape
            pairs[name] = ((rng.standard_normal((rank, n_in)) / np.sqrt(n_in)).astype(np.float32),
                           (rng.standard_normal((n_out, rank)) * 0.01).astype(np.float32))
    return write_adapter(out, f.metadata["general.architecture"], pairs, alpha=2.0 * rank)


def serve_tps(which: str, model: Path, lora: Path | None, batch: int) -> float:
    port = free_port()
    common = ["-m", str(model), "--port", str(port), "-np", "8", "-c", str(8 * 512), "-t", "2"]
    common += ["--lora", str(lora)] if lora else []
    cmd = ([str(PEER / "llama-server"), *common] if which == "llama-server"
           else [str(ROOT / ".venv/bin/slotserver"), "serve", *common])
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_healthy(port, which, proc)
        body = {"n_predict": TOKENS, "ignore_eos": True, "temperature": 0, "cache_prompt": False}
        post(port, "/completion", body | {"prompt": list(range(100, 100 + PROMPT)), "n_predict": 4})   # warm-up
        with ThreadPoolExecutor(batch) as pool:
            answers = list(pool.map(lambda i: post(port, "/completion", body | {"prompt": list(range(100 + i, 100 + i + PROMPT))}),
                                    range(batch)))
        return sum(a["timings"]["predicted_per_second"] for a in answers)
    finally:
        proc.terminate()
        proc.wait()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--model", type=Path, default=None)
    args = ap.parse_args()
    model = args.model or default_model_path()
    with tempfile.TemporaryDirectory() as tmp:
        lora = adapter(model, Path(tmp) / "lora.gguf", args.rank)
        best: dict = {}
        for _ in range(args.rounds):
            for b in BATCHES:
                for name in ("slotserver", "llama-server"):
                    for with_lora in (False, True):
                        tps = serve_tps(name, model, lora if with_lora else None, b)
                        best[name, b, with_lora] = max(best.get((name, b, with_lora), 0.0), tps)
    print(f"{model.name}, rank {args.rank} adapter on {', '.join(TARGETS)}, decode tok/s (best of {args.rounds})")
    for b in BATCHES:
        s0, s1, l0, l1 = (best[n, b, w] for n in ("slotserver", "llama-server") for w in (False, True))
        print(f"b={b}: slotserver {s0:.1f} -> {s1:.1f} with the adapter (x{s1 / s0:.2f}); llama-server {l0:.1f} -> "
              f"{l1:.1f} (x{l1 / l0:.2f}); slotserver / llama-server: {s0 / l0:.2f} without, {s1 / l1:.2f} with")
    return 0


if __name__ == "__main__":
    sys.exit(main())
