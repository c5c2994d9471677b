"""The prompts a benchmark sends: seeded random token ids, or a fixed set from a JSON file.

Random prompts are lists of token ids, sent as the `prompt` itself. Both llama-server's
/completion and the OpenAI /v1/completions of llama-server, vLLM and slotserver accept a list of
ints as a prompt, and no BOS is added to one, so every prompt is exactly `input_len` tokens on the
server: no tokenizer is needed here, and no detokenize/retokenize drift changes the length (the
reason vLLM's random dataset needs a correction loop). Ids are drawn uniformly from the whole
vocabulary, special tokens included; with `ignore_eos` they only cost compute like any other.

Warm-up prompts are drawn after the measured ones, so changing `--warmup` never changes what is
measured for a given seed.
"""

from __future__ import annotations

import itertools
import json
import random
from dataclasses import dataclass
from pathlib import Path

from slotserver.bench.config import ConfigError


@dataclass(frozen=True)
class Prompt:
    content: str | tuple[int, ...]   # text, or token ids sent as they are
    n_tokens: int | None             # known length (token ids); None for text: the server says

    def __post_init__(self) -> None:
        if not self.content:
            raise ConfigError("a benchmark prompt must not be empty")

    def wire(self) -> str | list[int]:
        """The JSON `prompt` value."""
        return self.content if isinstance(self.content, str) else list(self.content)


def random_prompts(count: int, input_len: int, vocab_size: int, seed: int) -> list[Prompt]:
    """`count` prompts of `input_len` ids drawn uniformly from [0, vocab_size), seeded."""
    if count < 0 or input_len < 1 or vocab_size < 1:
        raise ConfigError(f"bad random prompt shape: count={count}, input_len={input_len}, "
                          f"vocab_size={vocab_size}")
    rng = random.Random(seed)
    return [Prompt(tuple(rng.randrange(vocab_size) for _ in range(input_len)), input_len)
            for _ in range(count)]


def load_prompt_file(path: Path) -> list[str]:
    """A JSON file holding a non-empty list of non-empty strings."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ConfigError(f"{path}: not valid JSON ({e})") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not UTF-8 text") from None
    if not isinstance(data, list) or not data:
        raise ConfigError(f"{path}: expected a non-empty JSON list of prompt strings")
    for i, item in enumerate(data):
        if not isinstance(item, str) or not item:
            raise ConfigError(f"{path}: item {i} is not a non-empty string: {item!r:.60}")
    return data


def file_prompts(texts: list[str], count: int) -> list[Prompt]:
    """The file's prompts in order, repeated from the start when `count` is larger."""
    return [Prompt(t, None) for t in itertools.islice(itertools.cycle(texts), count)]


def build_prompts(count: int, input_len: int, seed: int, vocab_size: int | None = None,
                  dataset: Path | None = None) -> list[Prompt]:
    """File prompts when `dataset` is given, else random ids (which need `vocab_size`)."""
    if dataset is not None:
        return file_prompts(load_prompt_file(dataset), count)
    if vocab_size is None:
        raise ConfigError("random prompts need the vocabulary size")
    return random_prompts(count, input_len, vocab_size, seed)
