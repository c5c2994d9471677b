"""Split a GGUF into parts with gguf-py, as `llama-gguf-split --split --split-max-tensors N` does, and
check that slotserver and llama-server answer the same from the parts as from the whole file.

    .venv/bin/python playground/split_gguf.py MODEL.gguf OUT_DIR --max-tensors 64 [--llama-bin DIR]

Writes OUT_DIR/STEM-00001-of-0000N.gguf..., then prints the greedy continuation of a prompt by
slotserver from the whole file and from the first part (they must be the same ids), and, with
--llama-bin (the folder ../shared/tools/llamacpp-peer/build prints), llama-server's greedy ids from
both, which shows the parts are files llama.cpp reads as one model.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from gguf_rewrite import rewrite  # noqa: E402

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


def llama_greedy(bin_dir: Path, path: Path, n: int, port: int = 8093) -> list[int]:
    """llama-server's greedy ids for PROMPT from `path` (started, asked once, stopped)."""
    import httpx

    cmd = [str(bin_dir / "llama-server"), "-m", str(path), "--port", str(port), "-t", "2", "-c", "512", "-np", "1"]
    server = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(600):
            if server.poll() is not None:
                raise SystemExit(f"llama-server exited: {server.stderr.read()[-500:]}")
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        r = httpx.post(url + "/completion", json={"prompt": PROMPT, "n_predict": n, "temperature": 0,
                                                  "return_tokens": True}, timeout=300)
        return r.json()["tokens"]
    finally:
        server.terminate()
        server.wait(30)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--max-tensors", type=int, default=64)
    ap.add_argument("-n", type=int, default=24)
    ap.add_argument("--llama-bin", type=Path)
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    first = split(a.model, a.out, a.max_tensors)
    print(f"parts: {', '.join(p.name for p in sorted(a.out.glob(first.name.split('-00001-')[0] + '-*')))}")
    whole, parts = slotserver_greedy(a.model, a.n), slotserver_greedy(first, a.n)
    print(f"slotserver whole: {whole}\nslotserver parts: {parts}\nsame ids: {whole == parts}")
    if a.llama_bin:
        lw, lp = llama_greedy(a.llama_bin, a.model, a.n), llama_greedy(a.llama_bin, first, a.n)
        print(f"llama-server whole: {lw}\nllama-server parts: {lp}\nsame ids: {lw == lp}")


if __name__ == "__main__":
    main()
