"""Real vocabularies from tests/fixtures/tokenizers/ and llama.cpp's token ids for them.

Made by playground/make_tokenizer_fixtures.py: each `<name>.gguf.xz` is a vocab-only GGUF
(gemma3 from the real gemma-3-270m file; llama-spm, phi-3, qwen2 from llama.cpp's own test
vocabularies), `<name>.json` holds `llama-tokenize`'s ids for a text corpus. The files are read
once per test session (a 262k vocabulary takes about a second to turn into a tokenizer).
"""

from __future__ import annotations

import functools
import json
import lzma
import tempfile
from pathlib import Path

from slotserver.model.gguf_file import GGUFFile
from slotserver.model.text.tokenizer import Tokenizer

FOLDER = Path(__file__).parent / "fixtures" / "tokenizers"
NAMES = ("gemma3", "llama-spm", "phi-3", "qwen2", "minicpm5")
# a pre-tokenizer llama.cpp has no vocab file of: another vocabulary with its pre renamed (the ids in
# `<name>.json` are llama-tokenize's on exactly that renamed file: make_tokenizer_fixtures.py RENAMED_PRE).
# qwen2's vocabulary has single-digit tokens only, so this checks the name, the flags and the splits
# on it, not MiniCPM5's digit triples (llama-bpe's vocab, which has them, matched on all 91 texts too:
# `make_tokenizer_fixtures.py --check-only`, not kept: 6 MB)
RENAMED = {"minicpm5": "qwen2"}


@functools.lru_cache(maxsize=None)
def metadata(name: str) -> dict:
    """GGUF key/values of the vocabulary `name` (decompressed to a temporary file to open it)."""
    if name in RENAMED:
        return metadata(RENAMED[name]) | {"tokenizer.ggml.pre": name}
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"{name}.gguf"
        path.write_bytes(lzma.decompress((FOLDER / f"{name}.gguf.xz").read_bytes()))
        return dict(GGUFFile.open(path).metadata)


@functools.lru_cache(maxsize=None)
def tokenizer(name: str) -> Tokenizer:
    return Tokenizer.from_metadata(metadata(name))


@functools.lru_cache(maxsize=None)
def rows(name: str) -> list[dict]:
    """[{text, ids (add_special, no parse_special), ids_parse_special (no BOS)}] from llama.cpp."""
    return json.loads((FOLDER / f"{name}.json").read_text())["rows"]
