"""Split a GGUF into parts with gguf-py, as `llama-gguf-split --split --split-max-tensors N` does, and
check that slotserver and llama-server answer the same from the parts as from the whole file.

    .venv/bin/python playground/split_gguf.py MODEL.gguf OUT_DIR --max-tensors 64 [--peer]

Writes OUT_DIR/STEM-00001-of-0000N.gguf..., then prints the greedy continuation of a prompt by
slotserver from the whole file and from the first part (they must be the same ids), and, with
--peer (llama-server from playground/local_server.py's LLAMA_CPP_DIR), llama-server's greedy ids from
both, which shows the parts are files llama.cpp reads as one model.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from gguf_rewrite import rewrite  # noqa: E402

sys.path.insert(0, str(ROOT / "playground"))
from local_server import PEER, free_port, post, wait_healthy  # noqa: E402

PROMPT = "The capital of France is"


def split(src: Path, out: Path, max_tensors: int) -> Path:
    """src as parts of at most `max_tensors` tensors in `out` -> the first part's path."""
    return rewrite(src, out / src.name, split_max_tensors=max_tensors)


def slotserver_greedy(path: Path, n: int) -> list[int]:
    from slotserver.model.bundle import ModelBundle
    from slotserver.model.config import ModelConfig
    from slotserver.model.generate import GenRequest, generate

    bundle = ModelBundle.load(ModelConfig(path))
    ids = bundle.tokenizer.encode(PROMPT, add_special=True, parse_special=True)
    out = generate(bundle.model, [GenRequest(ids, n)], bundle.tokenizer.eog_ids)
    return out[0].tokens


def llama_greedy(path: Path, n: int) -> list[int]:
    """llama-server's greedy ids for PROMPT from `path` (started, asked once, stopped)."""
    port = free_port()
    cmd = [str(PEER / "llama-server"), "-m", str(path), "--port", str(port), "-t", "2", "-c", "512", "-np", "1"]
    server = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_healthy(port, f"llama-server on {path.name}", server)
        return post(port, "/completion", {"prompt": PROMPT, "n_predict": n, "temperature": 0,
                                          "return_tokens": True})["tokens"]
    finally:
        server.terminate()
        server.wait(30)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--max-tensors", type=int, default=64)
    ap.add_argument("-n", type=int, default=24)
    ap.add_argument("--peer", action="store_true", help=f"also llama-server ({PEER}) on both")
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    first = split(a.model, a.out, a.max_tensors)
    print(f"parts: {', '.join(p.name for p in sorted(a.out.glob(first.name.split('-00001-')[0] + '-*')))}")
    whole, parts = slotserver_greedy(a.model, a.n), slotserver_greedy(first, a.n)
    print(f"slotserver whole: {whole}\nslotserver parts: {parts}\nsame ids: {whole == parts}")
    if a.peer:
        lw, lp = llama_greedy(a.model, a.n), llama_greedy(first, a.n)
        print(f"llama-server whole: {lw}\nllama-server parts: {lp}\nsame ids: {lw == lp}")


if __name__ == "__main__":
    main()
