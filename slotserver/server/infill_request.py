"""POST /infill's own fields -> a validated `InfillInput` (infill_prompt.py lays out the prompt).

The fields, as llama-server reads them (server-context.cpp `post_infill`):
  input_prefix  required: the code before the cursor, a string or a list mixing strings and token
                ids (llama-server's `tokenize_mixed`; strings tokenized without special tokens)
  input_suffix  required: the code after the cursor, the same forms
  input_extra   optional: [{"filename": string (default "tmp"), "text": string}, ...], other files
  prompt        optional string: text after the prefix, e.g. the start of the line being completed
                (tokenized WITH special tokens, as llama-server does)
Every other field is /completion's (params.py). Messages are llama-server's where it has one.

Where llama-server's checks fall through, a 400 here instead: it notes a non-string `prompt`, a
missing `input_prefix` or `input_suffix` but goes on (the prompt then counts as empty; a missing
prefix or suffix becomes a 500 from its JSON library). Null counts as absent (fields.py), so
`"input_extra": null` is no extra context (llama-server: 400, "must be an array").
"""

from __future__ import annotations

from typing import Any

from slotserver.model.text.tokenizer import Tokenizer
from slotserver.server.errors import bad_request
from slotserver.server.infill_prompt import DEFAULT_FILENAME, InfillInput
from slotserver.server.prompt import check_token_ids, encode


def _is_id(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def mixed_tokens(tokenizer: Tokenizer, body: dict[str, Any], name: str) -> tuple[int, ...]:
    """A required prefix/suffix field: a string, or a list of strings and token ids, each string
    tokenized without BOS or special tokens and the ids kept (llama-server's `tokenize_mixed`)."""
    value = body.get(name)
    if value is None:
        raise bad_request(f"\"{name}\" is required")
    parts = [value] if isinstance(value, str) else value
    if not isinstance(parts, list) or not all(isinstance(p, str) or _is_id(p) for p in parts):
        raise bad_request(f"\"{name}\" must be a string or an array of strings and token ids")
    ids: list[int] = []
    for part in parts:
        ids.extend(encode(tokenizer, part, False, False) if isinstance(part, str) else [part])
    return tuple(check_token_ids(ids, tokenizer.vocab_size, f"\"{name}\""))


def extra_chunks(body: dict[str, Any]) -> tuple[tuple[str, str], ...]:
    """`input_extra` as (filename, text) pairs, each chunk checked as llama-server checks it."""
    value = body.get("input_extra")
    if value is None:
        return ()
    if not isinstance(value, list):
        raise bad_request("\"input_extra\" must be an array of {\"filename\": string, \"text\": string}")
    chunks = []
    for chunk in value:
        if not isinstance(chunk, dict) or not isinstance(chunk.get("text"), str):
            raise bad_request("extra_context chunk must contain a \"text\" field with a string value")
        if "filename" in chunk and not isinstance(chunk["filename"], str):
            raise bad_request("extra_context chunk's \"filename\" field must be a string")
        chunks.append((chunk.get("filename", DEFAULT_FILENAME), chunk["text"]))
    return tuple(chunks)


def prompt_tokens(tokenizer: Tokenizer, body: dict[str, Any]) -> tuple[int, ...]:
    """The optional `prompt`, a string only; special-token text in it becomes those tokens."""
    value = body.get("prompt")
    if value is None:
        return ()
    if not isinstance(value, str):
        raise bad_request("\"prompt\" must be a string")
    return tuple(encode(tokenizer, value, False, True))


def parse_infill(body: dict[str, Any], tokenizer: Tokenizer) -> InfillInput:
    """The body's infill fields, validated and tokenized (run it off the event loop)."""
    prompt = prompt_tokens(tokenizer, body)
    prefix = mixed_tokens(tokenizer, body, "input_prefix")
    suffix = mixed_tokens(tokenizer, body, "input_suffix")
    return InfillInput(prefix=prefix, suffix=suffix, extra=extra_chunks(body), prompt=prompt)
