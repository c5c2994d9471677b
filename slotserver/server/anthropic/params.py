"""Anthropic Messages request bodies (/v1/messages, /v1/messages/count_tokens) -> the chat machinery.

The body is checked and translated into an OpenAI chat body, which `parse_chat` then turns into a
job as for /v1/chat/completions: same template rendering, tool prompts and grammars, sampling
fields, reasoning split. The fields, as llama-server maps them (server-chat.cpp
`server_chat_convert_anthropic_to_oai`) unless said otherwise:
- `system`, `messages`: anthropic/messages.py. `model` is echoed back.
- `max_tokens` -> max_tokens; required on /v1/messages, as Anthropic's API has it (llama-server
  fills in 4096), not read by count_tokens. `stop_sequences` -> stop; `temperature`, `top_p`,
  `top_k`, `stream` and llama-server's `chat_template_kwargs` pass through.
- `tools` (custom tools: name, description, input_schema) -> function tools. `tool_choice`:
  auto -> "auto", any -> "required", none -> "none", tool -> that function (llama-server forces
  any tool for both `any` and `tool`, and ignores `none`); `disable_parallel_tool_use` -> the
  opposite `parallel_tool_calls` (absent: llama-server's default, one call). A tool with
  `strict: true` needs a forced choice (any / tool): only then is the output held to its schema.
- `thinking`: {"type": "enabled", "budget_tokens": N} / {"type": "adaptive"} think (the template's
  `enable_thinking`), {"type": "disabled"} does not; `display: "omitted"` returns thinking blocks
  without their text. `budget_tokens` (default 10000, as llama-server) becomes the chat body's
  `thinking_budget_tokens`: after N thinking tokens `</think>` is forced (budget_fields.py; only
  templates with a reasoning block have one to limit, as in llama-server).
- `metadata.user_id` is accepted (llama-server keeps it and uses it for nothing).
Any other field is a 400 naming it, never silently dropped.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from slotserver.engine.grammar import Grammars
from slotserver.model.text.chat_template import ChatTemplate
from slotserver.model.text.tokenizer import Tokenizer
from slotserver.server.anthropic.messages import convert_messages
from slotserver.server.chat_options import ChatDefaults
from slotserver.server.config import GenerationDefaults
from slotserver.server.errors import bad_request
from slotserver.server.fields import INT32_MAX, Fields
from slotserver.server.openai_params import OpenAIJob, parse_chat, render_chat_request
from slotserver.server.prompt import encode
from slotserver.server.tools.request import parse_tools

FIELDS = ("model", "messages", "max_tokens", "system", "stop_sequences", "stream", "temperature", "top_p",
          "top_k", "tools", "tool_choice", "metadata", "thinking", "chat_template_kwargs")
PASSED = ("model", "stream", "temperature", "top_p", "top_k")   # same name and meaning in the chat body
CHOICES = {"auto": "auto", "any": "required", "none": "none"}
THINKING = ("enabled", "adaptive", "disabled")
LLAMA_BUDGET = 10000   # llama-server's budget_tokens when "enabled" gives none


@dataclass(frozen=True)
class MessagesJob:
    chat: OpenAIJob             # the translated request (one job: Anthropic has no `n`)
    omit_thinking: bool         # thinking.display "omitted": thinking blocks carry no text


def _check_fields(body: dict) -> None:
    for key, value in body.items():
        if key not in FIELDS and value is not None:
            raise bad_request(f"'{key}' is not supported on the Messages API (supported: {', '.join(FIELDS)})")


def _keys(obj: dict, allowed: tuple[str, ...], where: str) -> None:
    for key, value in obj.items():
        if key not in allowed and value is not None:
            raise bad_request(f"'{where}.{key}' is not supported")


def _tool(i: int, tool: Any) -> dict:
    where = f"tools[{i}]"
    if not isinstance(tool, dict):
        raise bad_request(f"'{where}' must be an object {{name, description, input_schema}}")
    if tool.get("type") not in (None, "custom"):
        raise bad_request(f"'{where}.type' {tool['type']!r} is not supported: only custom tools (name, description, "
                          "input_schema) are; Anthropic's server tools run on Anthropic's side")
    _keys(tool, ("type", "name", "description", "input_schema", "cache_control", "strict"), where)
    name, desc = tool.get("name"), tool.get("description")
    if not isinstance(name, str) or not name:
        raise bad_request(f"'{where}.name' must be a non-empty string")
    if desc is not None and not isinstance(desc, str):
        raise bad_request(f"'{where}.description' must be a string")
    schema = tool.get("input_schema", {"type": "object", "properties": {}})
    if not isinstance(schema, dict):
        raise bad_request(f"'{where}.input_schema' must be a JSON Schema object")
    Fields(tool).bool("strict", False)
    return {"type": "function", "function": {"name": name, "description": desc or "", "parameters": schema}}


def _tool_choice(value: Any) -> tuple[Any, bool | None]:
    """-> (the chat body's tool_choice, parallel_tool_calls or None for the default)."""
    if value is None:
        return None, None
    kind = value.get("type") if isinstance(value, dict) else None
    if kind not in (*CHOICES, "tool"):
        raise bad_request("'tool_choice' must be {\"type\": \"auto\" | \"any\" | \"none\"} or "
                          "{\"type\": \"tool\", \"name\": ...}")
    _keys(value, ("type", "name", "disable_parallel_tool_use") if kind == "tool" else
          ("type", "disable_parallel_tool_use"), "tool_choice")
    disable = Fields(value).raw("disable_parallel_tool_use")
    if disable is not None and not isinstance(disable, bool):
        raise bad_request("'tool_choice.disable_parallel_tool_use' must be true or false")
    parallel = None if disable is None else not disable
    if kind != "tool":
        return CHOICES[kind], parallel
    if not isinstance(value.get("name"), str) or not value["name"]:
        raise bad_request("'tool_choice.name' must name one of 'tools'")
    return {"type": "function", "function": {"name": value["name"]}}, parallel


def _tools(body: dict, oai: dict) -> None:
    raw = body.get("tools")
    if raw is not None and not isinstance(raw, list):
        raise bad_request("'tools' must be a list of tools {name, description, input_schema}")
    choice, parallel = _tool_choice(body.get("tool_choice"))
    forced = choice == "required" or isinstance(choice, dict)
    for i, tool in enumerate(raw or []):
        if isinstance(tool, dict) and tool.get("strict") is True and not forced:
            raise bad_request(f"'tools[{i}].strict': calls are held to their schema only with a forced "
                              "tool_choice ({\"type\": \"any\"} or {\"type\": \"tool\"})")
    if raw:
        oai["tools"] = [_tool(i, t) for i, t in enumerate(raw)]
    for key, value in (("tool_choice", choice), ("parallel_tool_calls", parallel)):
        if value is not None:
            oai[key] = value


def _thinking(value: Any) -> tuple[bool | None, bool, int | None]:
    """-> (enable_thinking or None for the template's default, omit the thinking text, the
    budget: `thinking_budget_tokens`, or None)."""
    if value is None:
        return None, False, None
    kind = value.get("type") if isinstance(value, dict) else None
    if kind not in THINKING:
        raise bad_request("'thinking' must be {\"type\": \"enabled\", \"budget_tokens\": N}, "
                          "{\"type\": \"adaptive\"} or {\"type\": \"disabled\"}")
    _keys(value, ("type", "budget_tokens", "display") if kind == "enabled" else
          ("type", "display") if kind == "adaptive" else ("type",), "thinking")
    display = Fields(value).str("display", "summarized")
    if display not in ("summarized", "omitted"):
        raise bad_request("'thinking.display' must be \"summarized\" or \"omitted\"")
    budget = Fields(value).int("budget_tokens", LLAMA_BUDGET, lo=0, hi=INT32_MAX) if kind == "enabled" else None
    return kind != "disabled", display == "omitted", budget


def _template_kwargs(f: Fields, thinking: bool | None) -> dict | None:
    kwargs = f.obj("chat_template_kwargs")
    if thinking is None:
        return kwargs
    own = (kwargs or {}).get("enable_thinking")
    if own is not None and own != thinking:
        raise bad_request("'thinking' and 'chat_template_kwargs.enable_thinking' disagree")
    return {**(kwargs or {}), "enable_thinking": thinking}


def chat_body(body: Any, counting: bool) -> tuple[dict, bool]:
    """The Messages body -> (the equivalent chat body, omit_thinking); every field checked."""
    if not isinstance(body, dict):
        raise bad_request("the request body must be a JSON object")
    f = Fields(body)
    _check_fields(body)
    if "messages" not in body:
        raise bad_request("'messages' is required")
    oai: dict[str, Any] = {"messages": convert_messages(body.get("system"), body["messages"])}
    if not counting and not f.has("max_tokens"):
        raise bad_request("'max_tokens' is required")
    max_tokens = f.int("max_tokens", -1, lo=1) if f.has("max_tokens") else None
    stops = f.raw("stop_sequences", [])
    if not isinstance(stops, list):
        raise bad_request("'stop_sequences' must be a list of strings")
    oai["stop"] = list(f.str_list("stop_sequences"))
    metadata = f.obj("metadata") or {}
    _keys(metadata, ("user_id",), "metadata")
    Fields(metadata).str("user_id")
    _tools(body, oai)
    thinking, omit, budget = _thinking(body.get("thinking"))
    kwargs = _template_kwargs(f, thinking)
    extra = {"max_tokens": max_tokens, "chat_template_kwargs": kwargs, "thinking_budget_tokens": budget,
             **{k: body.get(k) for k in PASSED}}
    oai.update({k: v for k, v in extra.items() if v is not None})
    return oai, omit


def parse_messages_request(body: Any, tokenizer: Tokenizer, template: ChatTemplate, defaults: GenerationDefaults,
                           default_model: str, grammars: Grammars | None, chat: ChatDefaults) -> MessagesJob:
    """POST /v1/messages -> its job (tokenizes and may compile a grammar: run it off the loop)."""
    oai, omit = chat_body(body, counting=False)
    return MessagesJob(parse_chat(oai, tokenizer, template, defaults, default_model, grammars, 1, chat), omit)


def count_tokens(body: Any, tokenizer: Tokenizer, template: ChatTemplate, chat: ChatDefaults) -> int:
    """POST /v1/messages/count_tokens: the tokens of the prompt /v1/messages would render."""
    oai, _ = chat_body(body, counting=True)
    f = Fields(oai)
    text, _ = render_chat_request(f, template, parse_tools(f, template.source, chat.tool_format), chat)
    return len(encode(tokenizer, text, True, True))
