"""llama-server request fields we do not implement: a 400 naming the field, never a silent no-op.

The list comes from an audit of the vendored llama.cpp's tools/server (server-schema.cpp
`make_llama_cmpl_schema`, server-common.cpp `oaicompat_chat_params_parse` and
`oaicompat_completion_params_parse`). Each field here is accepted at its default (absent, null,
or the value that turns the feature off), so clients replaying llama-server's settings keep
working, and refused with a reason otherwise. Fields that need the engine (a stop rule, a
sampler, KV shifting) are refused rather than half-implemented outside it.

Fields llama-server reads but gives no effect on a route are accepted and validated there, as it
does: `reasoning_format` off the chat route, `stream_options` on /completion, `response_fields` on
the OpenAI routes (it only shapes /completion's answer). `n_keep`, `n_discard` (context shift) and
`n_cache_reuse` (chunk reuse) are honoured: server/params.py passes them to the engine.
The README's "Request fields" table lists all of it.
"""

from __future__ import annotations

from slotserver.server.errors import bad_request
from slotserver.server.fields import Fields
from slotserver.server.reasoning import FORMATS

# (field, why it is refused); each is off at false, an empty string or an empty list
FLAGS = (
    ("verbose", "the __verbose debug field is not produced"),
    ("backend_sampling", "sampling always runs in slotserver's own sampler"),
    ("grammar_lazy", "lazy grammars (applied from a trigger on) are not supported"),
    ("reasoning_control", "ending reasoning at run time is not supported"),
)
NON_EMPTY = (
    ("grammar_triggers", "grammar triggers (lazy grammars) are not supported"),
    ("preserved_tokens", "preserved tokens (lazy grammars) are not supported"),
    ("chat_parser", "chat parsers are chosen by the server"),
    ("generation_prompt", "the generation prompt comes from the chat template"),
)


def _refuse(name: str, why: str):
    return bad_request(f"'{name}' is not supported: {why}")


def _check_common(f: Fields) -> None:
    for name, why in FLAGS:
        if f.bool(name, False):
            raise _refuse(name, why)
    for name, why in NON_EMPTY:
        value = f.raw(name)
        if value not in (None, "", [], {}):
            raise _refuse(name, why)
    if f.int("chat_format", 0, lo=0) != 0:
        raise _refuse("chat_format", "chat formats are chosen by the server")
    response_fields(f)


def response_fields(f: Fields) -> tuple[str, ...]:
    """`response_fields`: a list of field paths ("a/b" reaches into objects)."""
    value = f.raw("response_fields", [])
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise bad_request("'response_fields' must be a list of strings")
    return tuple(value)


def check_completion_fields(f: Fields) -> None:
    """/completion and /v1/completions: the common refusals, plus the chat-only fields that
    llama-server would act on here (echo, parsing tool calls). The reasoning budget fields:
    budget_fields.py."""
    _check_common(f)
    if f.bool("echo", False):
        raise _refuse("echo", "the prompt is not echoed")
    if f.bool("parse_tool_calls", False):
        raise _refuse("parse_tool_calls", "tool calls are parsed on /v1/chat/completions only")
    value = f.str("reasoning_format")
    if value is not None and value not in FORMATS:
        raise bad_request(f"'reasoning_format' must be one of {', '.join(FORMATS)}, got {value!r}")


def check_chat_fields(f: Fields) -> None:
    """/v1/chat/completions: the common refusals (its own fields are parsed by chat_options.py)."""
    _check_common(f)
    f.bool("parse_tool_calls", False)   # llama-server sets it itself from `tools`; a bool is accepted
