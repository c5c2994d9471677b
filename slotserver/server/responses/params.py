"""A Responses API request body -> the chat-completions body that `parse_chat` takes, plus what
the response object echoes back.

The Responses API is served by the chat machinery (as llama-server serves it: the body is
converted, then parsed as a chat request), so sampling, templates, tools, grammars and every
llama-server field (`top_k`, `grammar`, `timings_per_token`, `return_progress`, ...) behave as on
/v1/chat/completions. The Responses fields map as:
- `input`, `instructions` -> `messages` (responses/input.py); `max_output_tokens` -> `max_tokens`;
  `temperature`, `top_p`, `parallel_tool_calls`, `stream` pass through;
- `tools` (the flat {type: "function", name, description, parameters, strict}) and
  `tool_choice` (responses/tools.py);
- `text.format` (`json_schema` / `json_object`) -> `response_format`, enforced by the grammar
  engine; `reasoning.effort` -> `reasoning_effort`;
- `include: ["message.output_text.logprobs"]` and `top_logprobs` -> logprobs;
- identifiers that change nothing here (`metadata`, `user`, `safety_identifier`,
  `prompt_cache_key`, `max_tool_calls`: no built-in tools exist) are validated and echoed.
This server keeps no state: `store: true`, `previous_response_id`, `background`, `conversation`
and the other OpenAI features we do not have are a 400 naming the field (responses/fields.py),
never silently dropped. The OpenAI SDK sends none of them unless asked.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from slotserver.engine.grammar import Grammars
from slotserver.server.constraints import compile_checked
from slotserver.server.errors import bad_request
from slotserver.server.fields import Fields
from slotserver.server.responses.fields import RESPONSES_ONLY, check_fields, echoed_identifiers
from slotserver.server.responses.input import input_messages
from slotserver.server.responses.tools import convert_tools

LOGPROBS_INCLUDE = "message.output_text.logprobs"
INCLUDABLE = (LOGPROBS_INCLUDE, "reasoning.encrypted_content", "file_search_call.results",
              "web_search_call.results", "web_search_call.action.sources", "message.input_image.image_url",
              "computer_call_output.output.image_url", "code_interpreter_call.outputs")
MAX_TOP_LOGPROBS = 20


@dataclass(frozen=True)
class ResponsesRequest:
    chat: dict[str, Any]    # the chat-completions body parse_chat takes
    echo: dict[str, Any]    # the request's settings, repeated in the response object
    obfuscate: bool = False  # stream_options.include_obfuscation: pad streamed deltas


def _text_format(f: Fields, grammars: Grammars | None) -> tuple[dict | None, dict]:
    """`text` -> (chat response_format or None, the `text` object echoed). The schema is compiled
    here (and again by parse_chat) so that a bad one is a 400 naming `text.format`."""
    text = Fields(f.obj("text") or {})
    verbosity = text.str("verbosity", "medium")
    if verbosity != "medium":
        raise bad_request("'text.verbosity' other than \"medium\" is not supported: nothing here tunes "
                          "the answer's length to it")
    fmt = text.obj("format") or {"type": "text"}
    kind = fmt.get("type")
    echo = {"format": fmt, "verbosity": verbosity}
    if kind == "text":
        return None, echo
    if kind == "json_object":
        return {"type": "json_object"}, echo
    if kind != "json_schema":
        raise bad_request(f"'text.format.type' must be \"text\", \"json_object\" or \"json_schema\", got {kind!r}")
    schema, strict = fmt.get("schema"), fmt.get("strict")
    if not isinstance(schema, (dict, bool)):
        raise bad_request("'text.format.schema' must be a JSON Schema object")
    if strict is not None and not isinstance(strict, bool):
        raise bad_request("'text.format.strict' must be true or false")
    compile_checked("text.format", "json_schema", schema, grammars)
    wrapper = {"name": fmt.get("name") or "response", "schema": schema, "strict": strict}
    return {"type": "json_schema", "json_schema": wrapper}, echo


def _reasoning(f: Fields) -> tuple[str | None, dict]:
    """`reasoning` -> (reasoning_effort or None, the echoed object). Reasoning comes whole, as
    `reasoning_text` content: there is no summarizer, so only summary "auto" (or none) is taken."""
    r = Fields(f.obj("reasoning") or {})
    effort = r.str("effort")
    summary = r.str("summary") or r.str("generate_summary")
    if summary not in (None, "auto"):
        raise bad_request(f"'reasoning.summary' {summary!r} is not supported: no summaries are made, the "
                          "reasoning itself comes as reasoning_text content; use \"auto\" or leave it out")
    return effort, {"effort": effort, "summary": summary}


def _logprobs(f: Fields) -> tuple[bool, int]:
    """(logprobs wanted, top_logprobs): `include` names them; `top_logprobs` > 0 asks for them too."""
    include = f.raw("include", [])
    if not isinstance(include, list) or not all(isinstance(i, str) for i in include):
        raise bad_request("'include' must be a list of strings")
    for name in include:
        if name not in INCLUDABLE:
            raise bad_request(f"'include' names {name!r}, which is not one of {', '.join(INCLUDABLE)}")
    top = f.int("top_logprobs", 0, lo=0, hi=MAX_TOP_LOGPROBS)
    return LOGPROBS_INCLUDE in include or top > 0, top


def _chat_body(body: dict, f: Fields) -> dict:
    """The body without the Responses fields (what remains are llama-server's own, passed on)."""
    for name in ("messages", "logprobs"):
        if name in body:
            raise bad_request(f"'{name}' is a chat completions field: the Responses API takes "
                              + ("'input'" if name == "messages" else "include: [\"message.output_text.logprobs\"]"))
    if f.int("n", 1, lo=1) != 1:
        raise bad_request("'n' must be 1: a response holds one answer")
    return {k: v for k, v in body.items() if k not in RESPONSES_ONLY}


def parse_responses(body: dict[str, Any], grammars: Grammars | None = None) -> ResponsesRequest:
    """Validate a Responses body and convert it; every problem is a 400 naming the field."""
    f = Fields(body)
    check_fields(f)
    chat = _chat_body(body, f)
    chat["messages"] = input_messages(body)
    tools, choice, echo_tools, echo_choice = convert_tools(f)
    fmt, text = _text_format(f, grammars)
    if fmt is not None and "response_format" in body:
        raise bad_request("'text.format' and 'response_format' both constrain the output: send one")
    if fmt is not None and tools and choice != "none":
        raise bad_request("'text.format' cannot constrain the output together with 'tools' "
                          "(use tool_choice \"none\", or drop it)")
    effort, reasoning = _reasoning(f)
    want, top = _logprobs(f)
    max_out = f.int("max_output_tokens", -1, lo=1) if f.has("max_output_tokens") else None
    chat.update({k: v for k, v in (("tools", tools), ("tool_choice", choice), ("response_format", fmt),
                                   ("reasoning_effort", effort), ("max_tokens", max_out)) if v is not None})
    chat.update(logprobs=want, top_logprobs=top if want else None)
    echo = {"instructions": body.get("instructions"), "max_output_tokens": max_out,
            "parallel_tool_calls": f.bool("parallel_tool_calls", False), "previous_response_id": None,
            "reasoning": reasoning, "store": False, "text": text, "tool_choice": echo_choice,
            "tools": echo_tools, "top_logprobs": top, "truncation": "disabled", "background": False,
            **echoed_identifiers(f)}
    options = Fields(f.obj("stream_options") or {})
    return ResponsesRequest(chat, echo, options.bool("include_obfuscation", False))
