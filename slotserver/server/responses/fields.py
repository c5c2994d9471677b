"""The Responses API's fields that are neither generation nor input: refused, or validated and echoed.

Every field of OpenAI's `responses.create` is accounted for here or in responses/params.py, so
none is silently dropped (the route then hands what remains, llama-server's own fields, to the
chat parser, which ignores unknown names as llama-server does):
- state this server does not keep: `store: true` (nothing is stored: a later GET or
  `previous_response_id` could not find it), `previous_response_id` (llama-server refuses it
  too), `conversation`, `background: true`, `prompt` (a stored prompt template);
- features it does not have: `truncation: "auto"` (dropping input to fit the context),
  `service_tier` other than auto/default, `prompt_cache_retention: "24h"`, and the newer
  `context_management`, `moderation`, `image`, `access_programs`, `background_options`,
  `prompt_cache_options`;
- identifiers with no effect on the answer (`metadata`, `user`, `safety_identifier`,
  `prompt_cache_key`; `max_tool_calls` limits built-in tools, of which there are none): checked
  and repeated in the response, as OpenAI does.
Each is accepted at its default (absent, null, false, or the default value).
"""

from __future__ import annotations

from typing import Any

from slotserver.server.errors import bad_request
from slotserver.server.fields import Fields

# fields of the Responses API that parse_chat must not see (converted, echoed, or refused)
RESPONSES_ONLY = frozenset((
    "input", "instructions", "max_output_tokens", "text", "reasoning", "include", "top_logprobs", "metadata",
    "store", "background", "previous_response_id", "truncation", "service_tier", "user", "safety_identifier",
    "prompt_cache_key", "prompt_cache_retention", "max_tool_calls", "stream_options", "tools", "tool_choice",
    "conversation", "prompt", "context_management", "moderation", "image", "access_programs",
    "background_options", "prompt_cache_options"))

NOT_STORED = "this server is stateless: it stores no responses"
REFUSED_IF_SET = (
    ("previous_response_id", f"{NOT_STORED}; send the earlier turns in 'input'"),
    ("conversation", f"{NOT_STORED} or conversations; send the earlier turns in 'input'"),
    ("prompt", "stored prompt templates are not supported; send 'instructions' and 'input'"),
    ("context_management", "context management (compaction) is not supported"),
    ("moderation", "moderation is not supported"),
    ("image", "image generation is not supported"),
    ("access_programs", "access programs are not supported"),
    ("background_options", "background responses are not supported"),
    ("prompt_cache_options", "prompt cache options are not supported: the slots' prompt cache is automatic"),
)
REFUSED_IF_TRUE = (
    ("store", f"{NOT_STORED} (send store: false, or leave it out)"),
    ("background", "background responses are not supported: a response is answered on its request"),
)
ALLOWED_VALUES = (   # (field, accepted values, why others are refused)
    ("truncation", ("disabled",), "input is never dropped to fit: a prompt too long for the context is a 400"),
    ("service_tier", ("auto", "default"), "there is one service tier"),
    ("prompt_cache_retention", ("in_memory",), "the prompt cache lives in the slots' memory only"),
)
MAX_METADATA = 16


def check_fields(f: Fields) -> None:
    """400 naming the first field set to something this server cannot do."""
    for name, why in REFUSED_IF_SET:
        if f.raw(name) not in (None, "", {}, []):
            raise bad_request(f"'{name}' is not supported: {why}")
    for name, why in REFUSED_IF_TRUE:
        if f.bool(name, False):
            raise bad_request(f"'{name}: true' is not supported: {why}")
    for name, values, why in ALLOWED_VALUES:
        value = f.str(name)
        if value is not None and value not in values:
            raise bad_request(f"'{name}' must be {' or '.join(repr(v) for v in values)}, got {value!r}: {why}")
    stream_options = f.obj("stream_options")
    if stream_options is not None:
        for key in stream_options:
            if key != "include_obfuscation":
                raise bad_request(f"'stream_options.{key}' is not a Responses stream option "
                                  "(only include_obfuscation is)")


def _metadata(f: Fields) -> dict[str, str] | None:
    meta = f.obj("metadata")
    if meta is None:
        return None
    if len(meta) > MAX_METADATA or not all(isinstance(k, str) and len(k) <= 64 and isinstance(v, str)
                                           and len(v) <= 512 for k, v in meta.items()):
        raise bad_request(f"'metadata' must hold at most {MAX_METADATA} string values (keys up to 64 "
                          "characters, values up to 512)")
    return meta


def echoed_identifiers(f: Fields) -> dict[str, Any]:
    """The identifiers and settings repeated in the response object, validated."""
    out: dict[str, Any] = {"metadata": _metadata(f) or {}}
    for name in ("user", "safety_identifier", "prompt_cache_key"):
        out[name] = f.str(name)
    out["max_tool_calls"] = f.int("max_tool_calls", 0, lo=1) if f.has("max_tool_calls") else None
    out["service_tier"] = "default"
    out["prompt_cache_retention"] = f.str("prompt_cache_retention")
    return out
