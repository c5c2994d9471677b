"""Prompts and logit biases in llama-server's accepted forms, turned into token ids.

A prompt is a string, a list of token ids, a list mixing strings and ids (strings are tokenized
with parse_special, ids kept; only the first element may get the BOS token), or an object
{"prompt_string": ...} (multimodal data is refused: no multimodal models here). Several prompts
are a list of those, as llama-server reads it (`tokenize_input_prompts`): a list holding only
ids, or both strings and ids, is ONE prompt; any other list is one prompt per element.
"""

from __future__ import annotations

import math
from typing import Any

from slotserver.server.errors import bad_request
from slotserver.model.text.detokenizer import detokenize
from slotserver.model.text.tokenizer import Tokenizer, TokenizerError


def prompt_text(tokenizer: Tokenizer, ids: list[int]) -> str:
    """A prompt as llama-server echoes it (/completion's `prompt`, /slots): its tokens through
    llama_detokenize with special tokens shown as text (`<bos>`, `<|im_start|>`) and llama.cpp's
    space rules, i.e. `common_detokenize(ctx, tokens, true)`."""
    return detokenize(tokenizer, ids, unparse_special=True)


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


MAX_PROMPTS = 64


def _single(prompt: list) -> bool:
    """llama-server: a list of ids only, or of strings and ids both, is one prompt."""
    ids = any(_is_id(x) for x in prompt)
    return ids and all(_is_id(x) or isinstance(x, str) for x in prompt) and (
        all(_is_id(x) for x in prompt) or any(isinstance(x, str) for x in prompt))


def split_prompts(prompt: Any) -> list[Any]:
    """The prompts of a `prompt` field, each a string, a list of ids/strings, or a prompt object."""
    if isinstance(prompt, (str, dict)) or (isinstance(prompt, list) and prompt and _single(prompt)):
        return [prompt]
    if not isinstance(prompt, list) or not prompt:
        raise bad_request("'prompt' must be a string, a list of token ids, a list of strings and ids, "
                          "or a list of such prompts")
    if len(prompt) > MAX_PROMPTS:
        raise bad_request(f"'prompt' holds {len(prompt)} prompts; at most {MAX_PROMPTS} per request")
    return list(prompt)


def tokenize_prompts(tokenizer: Tokenizer, prompt: Any) -> list[list[int]]:
    return [tokenize_prompt(tokenizer, p) for p in split_prompts(prompt)]


def tokenize_prompt(tokenizer: Tokenizer, prompt: Any) -> list[int]:
    """Token ids of ONE llama-server prompt (see the module docstring)."""
    vocab = tokenizer.vocab_size
    if isinstance(prompt, str):
        return encode(tokenizer, prompt, True, True)
    if isinstance(prompt, dict):
        if prompt.get("multimodal_data"):
            raise bad_request("Multimodal data provided, but model does not support multimodal requests.")
        if not isinstance(prompt.get("prompt_string"), str):
            raise bad_request("a prompt object must hold 'prompt_string', a string")
        return encode(tokenizer, prompt["prompt_string"], True, True)
    if not isinstance(prompt, list) or not prompt:
        raise bad_request("'prompt' must be a string, a list of token ids, or a list of strings and ids")
    if not all(isinstance(x, str) or _is_id(x) for x in prompt):
        raise bad_request("a prompt list must hold strings and token ids, got "
                          f"{next(x for x in prompt if not (isinstance(x, str) or _is_id(x)))!r}")
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
