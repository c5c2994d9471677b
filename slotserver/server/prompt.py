"""Prompts and logit biases in llama-server's accepted forms, turned into token ids.

A prompt is a string, a list of token ids, or a list mixing strings and ids (strings are
tokenized with parse_special, ids kept; only the first element may get the BOS token), or a
one-element list of one of those. Several prompts in one request are not supported (400).
"""

from __future__ import annotations

import math
from typing import Any

from slotserver.server.errors import bad_request
from slotserver.model.text.tokenizer import Tokenizer, TokenizerError


def check_token_ids(ids: list[Any], vocab: int, what: str) -> list[int]:
    for t in ids:
        if not isinstance(t, int) or isinstance(t, bool) or not 0 <= t < vocab:
            raise bad_request(f"{what} must hold token ids in [0, {vocab}), got {t!r}")
    return ids


def encode(tokenizer: Tokenizer, text: str, add_special: bool, parse_special: bool) -> list[int]:
    try:
        return tokenizer.encode(text, add_special=add_special, parse_special=parse_special)
    except TokenizerError as e:  # e.g. a lone surrogate from a "\ud800" escape
        raise bad_request(str(e)) from None


def _is_id(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def tokenize_prompt(tokenizer: Tokenizer, prompt: Any) -> list[int]:
    """Token ids of a llama-server `prompt` field (see the module docstring)."""
    vocab = tokenizer.vocab_size
    if isinstance(prompt, str):
        return encode(tokenizer, prompt, True, True)
    if not isinstance(prompt, list) or not prompt:
        raise bad_request("'prompt' must be a string, a list of token ids, or a list of strings and ids")
    if len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        return tokenize_prompt(tokenizer, prompt[0])
    if not all(isinstance(x, str) or _is_id(x) for x in prompt):
        raise bad_request("'prompt' holds several prompts or values that are neither strings nor "
                          "token ids; one prompt per request is supported")
    if all(isinstance(x, str) for x in prompt):
        raise bad_request("'prompt' is a list of several strings (several prompts); "
                          "one prompt per request is supported")
    ids: list[int] = []
    for i, x in enumerate(prompt):
        if isinstance(x, str):
            ids.extend(encode(tokenizer, x, i == 0, True))
        else:
            ids.append(x)
    return check_token_ids(ids, vocab, "'prompt'")


def _bias_value(token: Any, bias: Any, limit: float) -> float:
    """llama-server: a number, or false meaning -inf (the token is forbidden)."""
    if bias is False:
        return -math.inf
    if isinstance(bias, (int, float)) and not isinstance(bias, bool) and abs(bias) <= limit:
        return float(bias)
    raise bad_request(f"'logit_bias' for {token!r} must be false or a number in [-{limit:g}, {limit:g}], "
                      f"got {bias!r}")


def _bias_targets(tokenizer: Tokenizer, key: Any) -> list[int]:
    """A token id, a decimal string naming one (OpenAI's map keys), or text whose tokens get the bias."""
    if isinstance(key, str) and key.strip().isdigit():
        key = int(key)
    if _is_id(key):
        return check_token_ids([key], tokenizer.vocab_size, "'logit_bias'")
    if isinstance(key, str):
        return encode(tokenizer, key, False, False)
    raise bad_request(f"'logit_bias' keys must be token ids or strings, got {key!r}")


def parse_logit_bias(tokenizer: Tokenizer, value: Any,
                     limit: float = math.inf) -> tuple[tuple[int, float], ...]:
    """`[[id, bias], ...]`, `[["text", bias], ...]` or `{"id" | "text": bias}` -> (id, bias) pairs."""
    if value is None:
        return ()
    if isinstance(value, dict):
        pairs = list(value.items())
    elif isinstance(value, list) and all(isinstance(p, list) and len(p) == 2 for p in value):
        pairs = [tuple(p) for p in value]
    else:
        raise bad_request("'logit_bias' must be [[token, bias], ...] or {\"token\": bias, ...}")
    if len(pairs) > 1024:
        raise bad_request("'logit_bias' has more than 1024 entries")
    out = []
    for key, bias in pairs:
        b = _bias_value(key, bias, limit)
        out.extend((t, b) for t in _bias_targets(tokenizer, key))
    return tuple(out)
