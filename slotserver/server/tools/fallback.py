"""Tools for a template that does not render the request's call format: the fallback prompt.

Such a template (the default SmolLM2, plain ChatML, or any template under a `--tool-call-format`
it does not speak) gets what llama.cpp's polyfills gave it: the tools described in the system
message, in the format's own words, the history's assistant calls written as that format's text
and `tool` results as user messages, so the model sees in its history the very format it is asked
to produce. Two formats have a fallback:
- hermes (the default): Qwen 2.5's system text, `<tool_call>` blocks, `<tool_response>` blocks;
- generic (llama.cpp's): the tools as JSON, answers as {"tool_call": ...} / {"tool_calls": [...]}
  / {"response": ...} objects (a plain assistant turn is written as {"response": ...} while the
  request's tools are active, since that is what the model wrote; not a final one, which the
  answer continues), results as {"tool_response"}.
"""

from __future__ import annotations

import json
from typing import Any

from slotserver.model.text.chat_messages import join_parts, parse_messages
from slotserver.model.text.chat_template import ChatTemplateError
from slotserver.server.errors import bad_request
from slotserver.server.tools.formats import CLOSE, GENERIC, OPEN
from slotserver.server.tools.request import ToolConfig

HERMES_SYSTEM = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n{tools}\n</tools>\n\n"
    "For each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\n<tool_call>\n{{\"name\": <function-name>, \"arguments\": "
    "<args-json-object>}}\n</tool_call>")
GENERIC_SYSTEM = (
    "You can call any of the following tools to satisfy the user's requests: {tools}\n\n"
    "Respond in JSON format, either with `{key}` (a request to call tools) or with `response` (a reply "
    "to the user's request), e.g.\n{example}\nor\n{{\"response\": \"...\"}}")


def dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


def arguments(call: Any) -> Any:
    """A history call's arguments as an object (OpenAI sends a JSON string)."""
    fn = call.get("function", {}) if isinstance(call, dict) else {}
    args = fn.get("arguments", {})
    if isinstance(args, str):
        try:
            return json.loads(args) if args.strip() else {}
        except json.JSONDecodeError:
            raise bad_request(f"tool call arguments must be JSON, got {args[:80]!r}") from None
    return args


def _plain(call: dict) -> dict:
    return {"name": call.get("function", {}).get("name", ""), "arguments": arguments(call)}


def text_of(messages: list, i: int) -> str:
    """Message i's content as text (content parts joined as llama.cpp joins them): the fallback
    writes it inside its own text. A bad part is a 400 naming it."""
    try:
        content = parse_messages([messages[i]])[0]["content"]
    except ChatTemplateError as e:
        raise bad_request(str(e).replace("messages[0]", f"messages[{i}]", 1)) from None
    return content if isinstance(content, str) else join_parts(content)


def _system(tools: ToolConfig) -> str:
    if tools.format != GENERIC:
        return HERMES_SYSTEM.format(tools="\n".join(dumps(t) for t in tools.tools))
    key = "tool_calls" if tools.parallel else "tool_call"
    call = {"name": "tool_name", "arguments": {"arg1": "value"}}
    example = dumps({key: [call] if tools.parallel else call})
    return GENERIC_SYSTEM.format(tools=json.dumps(list(tools.tools), ensure_ascii=False, indent=2),
                                 key=key, example=example)


def _calls_text(fmt: str, message: dict, content: str) -> str:
    """An assistant turn with calls, as the format writes it."""
    calls = [_plain(c) for c in message["tool_calls"]]
    if fmt != GENERIC:
        blocks = [f"{OPEN}\n{dumps(c)}\n{CLOSE}" for c in calls]
        return "\n".join(([content] if content else []) + blocks)
    obj: dict[str, Any] = {"tool_call": calls[0]} if len(calls) == 1 else {"tool_calls": calls}
    return dumps({**obj, "content": content} if content else obj)


def _result_text(fmt: str, message: dict, content: str) -> str:
    """A `tool` message's result, as the user message the format shows it in."""
    if fmt != GENERIC:
        return f"<tool_response>\n{content}\n</tool_response>"
    response = {k: message[k] for k in ("name", "tool_call_id") if isinstance(message.get(k), str)}
    return dumps({"tool_response": {**response, "content": content}})


def _message(fmt: str, messages: list, i: int, active: bool) -> Any:
    m = messages[i]
    if not isinstance(m, dict):
        return m
    role = m.get("role")
    if role == "assistant" and m.get("tool_calls"):
        return {"role": "assistant", "content": _calls_text(fmt, m, text_of(messages, i) if m.get("content") else "")}
    if role == "tool":
        return {"role": "user", "content": _result_text(fmt, m, text_of(messages, i))}
    if role == "assistant" and fmt == GENERIC and active and i < len(messages) - 1:   # not a prefill
        return {**m, "content": dumps({"response": text_of(messages, i)})}
    if role == "system" and i == 0 and isinstance(m.get("content"), list):
        return {**m, "content": text_of(messages, i)}   # the tools' description is appended to it
    return m


def fallback_messages(messages: list, tools: ToolConfig) -> list:
    """The messages, reshaped for a template without the format, tools described up front."""
    out = [_message(tools.format, messages, i, tools.active) for i in range(len(messages))]
    if tools.active:
        described = _system(tools)
        first = out[0] if out else None
        if isinstance(first, dict) and first.get("role") == "system" and isinstance(first.get("content"), str):
            out[0] = {**first, "content": first["content"] + "\n\n" + described}
        else:
            out.insert(0, {"role": "system", "content": described})
    return out
