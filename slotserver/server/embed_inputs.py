"""The inputs of /embedding(s), /v1/embeddings and /rerank in llama-server's accepted shapes, as token ids.

`input` (or llama's `content`) is read as llama-server's `handle_embeddings_impl` reads it:
- a string: its tokens with [CLS] ... [SEP] (BOS/EOS as the model adds them), special-token text parsed;
- a list of token ids: used as given (nothing added);
- a list mixing strings and ids: ONE input, the first element's string with the special tokens;
- an object `{"prompt_string": ...}` (a string or such a mixed list), or an OpenAI content object
  `{"content": [{"type": "text", "text": ...}, ...]}` (the texts joined; images, audio or video
  are refused: no multimodal models here);
- a list of any of those (a list holding no token id at its top level): one input per element.
An empty list, an empty input (a token list `[]`) or an unknown shape is a 400 naming the field.

Every input must fit the server: at most `max_tokens` tokens (`EmbeddingConfig.max_tokens`),
else llama-server's "input (N tokens) is too large to process" (400 here: the client can fix it).
Unknown top-level fields are refused by name (`check_fields`), never silently ignored.
"""

from __future__ import annotations

from typing import Any

from slotserver.model.text.tokenizer import Tokenizer
from slotserver.server.errors import bad_request
from slotserver.server.prompt import check_token_ids, encode

MAX_INPUTS = 2048   # OpenAI's limit on one request's inputs
MEDIA_TYPES = ("image_url", "input_audio", "input_video", "video_url")


def check_fields(body: dict, allowed: frozenset[str], route: str) -> None:
    """400 naming every field of `body` that `route` does not know."""
    unknown = sorted(k for k in body if k not in allowed)
    if unknown:
        names = ", ".join(f"'{k}'" for k in unknown)
        raise bad_request(f"unknown field{'s' if len(unknown) > 1 else ''} {names} for {route} "
                          f"(accepted: {', '.join(sorted(allowed))})")


def _is_id(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def input_tokens(tokenizer: Tokenizer, value: Any, field: str) -> list[list[int]]:
    """The token ids of every input in `value` (see the module docstring)."""
    if isinstance(value, list) and not any(_is_id(x) for x in value):
        if not value:
            raise bad_request(f"'{field}' must not be empty")
        if len(value) > MAX_INPUTS:
            raise bad_request(f"'{field}' holds {len(value)} inputs; at most {MAX_INPUTS} per request")
        seqs = [_one(tokenizer, v, field) for v in value]
    else:
        seqs = [_one(tokenizer, value, field)]
    if any(not s for s in seqs):
        raise bad_request("Input content cannot be empty")
    return seqs


def _one(tok: Tokenizer, value: Any, field: str) -> list[int]:
    if isinstance(value, str):
        return encode(tok, value, True, True)
    if isinstance(value, dict):
        if "content" in value:
            return encode(tok, _content_text(value["content"], field), True, True)
        if "prompt_string" in value:
            if value.get("multimodal_data"):
                raise bad_request("Multimodal data provided, but model does not support multimodal requests.")
            return _one(tok, value["prompt_string"], field)
        raise bad_request(f"an object in '{field}' must hold 'content' (an array of content parts) "
                          "or 'prompt_string'")
    if isinstance(value, list) and all(isinstance(x, str) or _is_id(x) for x in value):
        ids: list[int] = []
        for i, x in enumerate(value):   # only the first element gets [CLS] ... [SEP], as llama-server
            ids.extend(encode(tok, x, i == 0, True) if isinstance(x, str) else [x])
        return check_token_ids(ids, tok.vocab_size, f"'{field}'")
    raise bad_request(f"'{field}' must be a string, a list of token ids, a list of strings and token ids, "
                      "an object with 'content' or 'prompt_string', or a list of those")


def _content_text(parts: Any, field: str) -> str:
    """OpenAI content parts -> their texts joined; only `text` parts (no multimodal models here)."""
    if not isinstance(parts, list):
        raise bad_request(f"'content' of an object in '{field}' must be an array of content parts")
    texts = []
    for part in parts:
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in MEDIA_TYPES:
            raise bad_request(f"{kind} input is not supported: this model takes text only")
        if kind != "text" or not isinstance(part.get("text", ""), str):
            raise bad_request(f"unsupported content[].type {kind!r} in '{field}' (only \"text\" parts, "
                              "each with a string 'text')")
        texts.append(part.get("text", ""))
    return "".join(texts)


def check_lengths(seqs: list[list[int]], max_tokens: int) -> None:
    """400 for an input longer than the server takes (llama-server's message, with its limit)."""
    for seq in seqs:
        if len(seq) > max_tokens:
            raise bad_request(f"input ({len(seq)} tokens) is too large to process. increase the physical batch "
                              f"size or the context size (current limit: {max_tokens} tokens)")
