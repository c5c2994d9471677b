"""`--override-kv KEY=TYPE:VALUE[,...]`: GGUF metadata values replaced at load, as llama.cpp's.

What users fix with it: a file's wrong tokenizer switch (`tokenizer.ggml.add_bos_token=bool:false`),
a context length, an expert count (`qwen3moe.expert_used_count=int:10`), a chat template name.
Types are llama.cpp's (common/common.cpp string_parse_kv_override): `int`, `float`, `bool`
(`true`/`false`) and `str` (at most 127 characters); keys shorter than 128 characters. Where
llama.cpp's `atol`/`atof` read a bad number as 0, a bad number is refused here by name.

An override replaces the key in the opened file's metadata before anything reads it (spec,
tokenizer, chat template), so every reader sees it; a key the file lacks is added (llama.cpp's
loader takes an override whether or not the file has the key). A key the file holds with another
type is refused, as llama.cpp's "Bad metadata override type" (an int for a float key too), and
so is an array (the vocabulary, merges): llama.cpp overrides scalars only.
"""

from __future__ import annotations

import logging

from slotserver.errors import ConfigError

log = logging.getLogger("slotserver.load")

TYPES = {"int": int, "float": float, "bool": bool, "str": str}


def parse_overrides(value: str) -> tuple[tuple[str, object], ...]:
    """One --override-kv value (comma-separated items) -> ((key, typed value), ...)."""
    return tuple(_parse_item(item) for item in value.split(","))


def from_args(args) -> tuple[tuple[str, object], ...]:
    """Every --override-kv of the parsed command line (cli/model_meta_args.py), in order."""
    return tuple(kv for value in getattr(args, "override_kv", None) or [] for kv in parse_overrides(value))


def _parse_item(item: str) -> tuple[str, object]:
    key, eq, typed = item.partition("=")
    if not eq or not key or len(key) >= 128:
        raise ConfigError(f"--override-kv {item!r}: expected KEY=TYPE:VALUE (a key under 128 characters)")
    kind, colon, text = typed.partition(":")
    if not colon or kind not in TYPES:
        raise ConfigError(f"--override-kv {item!r}: the type must be one of {', '.join(TYPES)} (KEY=TYPE:VALUE)")
    if kind == "str" and len(text) > 127:
        raise ConfigError(f"--override-kv {key}: a str value is at most 127 characters, got {len(text)}")
    if kind == "bool" and text not in ("true", "false"):
        raise ConfigError(f"--override-kv {item!r}: {text!r} is not a bool (true or false)")
    try:
        return key, text == "true" if kind == "bool" else TYPES[kind](text)
    except ValueError:
        raise ConfigError(f"--override-kv {item!r}: {text!r} is not {_a(kind)}") from None


def apply_overrides(path, metadata: dict, overrides: tuple[tuple[str, object], ...]) -> None:
    """Replace `metadata`'s keys (an opened GGUF's, read from `path`) by the overrides, in order."""
    for key, value in overrides:
        have = metadata.get(key)
        if isinstance(have, (list, tuple)):
            raise ConfigError(f"--override-kv {key}: {path} holds an array there; only single values are overridden")
        if have is not None and _kind(have) != _kind(value):
            raise ConfigError(f"--override-kv {key}: {path} holds {_a(_kind(have))} there, the override is "
                              f"{_a(_kind(value))}")
        metadata[key] = value
        log.info("metadata override: %s = %r (%s)", key, value, "replaced" if have is not None else "added")


def _kind(value: object) -> str:
    """The override type a GGUF value reads as (GGUF's many integer widths are all `int`)."""
    for name, t in (("bool", bool), ("int", int), ("float", float), ("str", str)):
        if isinstance(value, t):
            return name
    return type(value).__name__


def _a(kind: str) -> str:
    return f"an {kind}" if kind == "int" else f"a {kind}"
