"""The unigram (t5) tokenizer's load time, memory and speed on a synthetic XLM-R-sized vocabulary.

    .venv/bin/python playground/unigram_speed.py

250,000 random pieces (1-12 characters of Latin, accented, CJK and Hangul letters, half of them
word-initial) with random scores; the load is timed and its peak Python allocation traced, then
the encoding of ~2,600 characters of random words is timed. README.md's numbers (2026-11-27, a
2-core AVX-512 VNNI host): load 1.26 s, peak 79 MB, 24k characters/s.
"""

from __future__ import annotations

import random
import string
import time
import tracemalloc

from slotserver.model.text.tokenizer import Tokenizer

ALPHA = string.ascii_lowercase + "éèàüöäßçñ中文日本語한국어"


def metadata(n: int = 250_000, seed: int = 0) -> dict:
    rng, pieces = random.Random(seed), set()
    while len(pieces) < n:
        word = "".join(rng.choice(ALPHA) for _ in range(rng.choice([1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 12])))
        pieces.add("▁" * (rng.random() < 0.5) + word)
    tokens = ["<pad>", "</s>", "<unk>", "<s>"] + sorted(pieces)
    return {"tokenizer.ggml.model": "t5", "tokenizer.ggml.tokens": tokens,
            "tokenizer.ggml.scores": [-rng.random() * 20 for _ in tokens],
            "tokenizer.ggml.token_type": [3, 3, 2, 3] + [1] * (len(tokens) - 4),
            "tokenizer.ggml.add_space_prefix": True, "tokenizer.ggml.remove_extra_whitespaces": True}


def main() -> None:
    md, rng = metadata(), random.Random(1)
    start = time.perf_counter()
    Tokenizer.from_metadata(md)
    print(f"load {time.perf_counter() - start:.2f} s")
    tracemalloc.start()
    tok = Tokenizer.from_metadata(md)
    print(f"peak allocation while loading {tracemalloc.get_traced_memory()[1] / 1e6:.0f} MB")
    tracemalloc.stop()
    text = " ".join("".join(rng.choice(ALPHA) for _ in range(rng.randint(2, 9))) for _ in range(400))
    start = time.perf_counter()
    ids = tok.encode(text)
    elapsed = time.perf_counter() - start
    print(f"{len(text)} characters -> {len(ids)} ids in {elapsed * 1e3:.0f} ms: "
          f"{len(text) / elapsed / 1e3:.0f}k characters/s")


if __name__ == "__main__":
    main()
