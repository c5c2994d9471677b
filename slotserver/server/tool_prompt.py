"""Chat messages with tools -> the prompt, through the model's template or the Hermes fallback.

A template that renders tools itself (it mentions `tools`: Qwen 2.5, Hermes 2/3...) gets them in
its Jinja context, and the history's tool calls with their arguments as objects (what those
templates `tojson`). A template without tool support (the default SmolLM2, plain ChatML) gets what
llama.cpp's fallback gives it: the tools described in the system message, in Hermes' words, the
history's assistant calls written as `<tool_call>` blocks and `tool` results as user messages in
`<tool_response>` blocks, so the model sees the same format it is asked to produce.
"""

from __future__ import annotations

import json
from typing import Any

from slotserver.model.text.chat_messages import join_parts, parse_messages
from slotserver.model.text.chat_template import ChatTemplate, ChatTemplateError
from slotserver.server.errors import bad_request
from slotserver.server.tools import CLOSE, OPEN, ToolConfig

SYSTEM = ("# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
          "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n{tools}\n</tools>\n\n"
          "For each function call, return a json object with function name and arguments within "
          "<tool_call></tool_call> XML tags:\n<tool_call>\n{{\"name\": <function-name>, \"arguments\": "
          "<args-json-object>}}\n</tool_call>")


def _arguments(call: Any) -> Any:
    """A history call's arguments as an object (OpenAI sends a JSON string)."""
    fn = call.get("function", {}) if isinstance(call, dict) else {}
    args = fn.get("arguments", {})
    if isinstance(args, str):
        try:
            return json.loads(args) if args.strip() else {}
        except json.JSONDecodeError:
            raise bad_request(f"tool call arguments must be JSON, got {args[:80]!r}") from None
    return args


def _native(messages: list) -> list:
    """Arguments as objects, null content as "" (templates concatenate it)."""
    out = []
    for m in messages:
        if isinstance(m, dict) and m.get("tool_calls"):
            calls = [{**c, "function": {**c.get("function", {}), "arguments": _arguments(c)}} for c in m["tool_calls"]]
            m = {**m, "tool_calls": calls, "content": m.get("content") or ""}
        out.append(m)
    return out


def _call_text(call: dict) -> str:
    name = call.get("function", {}).get("name", "")
    return f"{OPEN}\n{json.dumps({'name': name, 'arguments': _arguments(call)}, ensure_ascii=False)}\n{CLOSE}"


def _text(messages: list, i: int) -> str:
    """Message i's content as text (content parts joined as llama.cpp joins them): the fallback
    writes it inside its own text. A bad part is a 400 naming it."""
    try:
        content = parse_messages([messages[i]])[0]["content"]
    except ChatTemplateError as e:
        raise bad_request(str(e).replace("messages[0]", f"messages[{i}]", 1)) from None
    return content if isinstance(content, str) else join_parts(content)


def _fallback(messages: list, tools: ToolConfig | None) -> list:
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            out.append(m)
            continue
        if m.get("role") == "assistant" and m.get("tool_calls"):
            parts = [_text(messages, i)] if m.get("content") else []
            parts += [_call_text(c) for c in m["tool_calls"]]
            m = {"role": "assistant", "content": "\n".join(parts)}
        elif m.get("role") == "tool":
            m = {"role": "user", "content": f"<tool_response>\n{_text(messages, i)}\n</tool_response>"}
        elif m.get("role") == "system" and i == 0 and isinstance(m.get("content"), list):
            m = {**m, "content": _text(messages, i)}   # the tools' description is appended to it
        out.append(m)
    if tools is not None and tools.active:
        described = SYSTEM.format(tools="\n".join(json.dumps(t, ensure_ascii=False) for t in tools.tools))
        if out and isinstance(out[0], dict) and out[0].get("role") == "system" and isinstance(out[0].get("content"), str):
            out[0] = {**out[0], "content": out[0]["content"] + "\n\n" + described}
        else:
            out.insert(0, {"role": "system", "content": described})
    return out


CONTINUE_MARK = "\u2063slotserver-continue\u2063"


def render_with_tools(template: ChatTemplate, messages: Any, tools: ToolConfig | None,
                      add_generation_prompt: bool = True, continue_final: bool = False,
                      variables: dict[str, Any] | None = None, **extra: Any) -> str:
    """The prompt text; template problems are a 400 naming them. `continue_final`: the prompt ends
    inside the last (assistant) message, right after its content, so generation continues it (the
    template renders a marker in its place, and the text is cut there, as llama.cpp does).
    `variables`: more of the template's context (chat_template_kwargs)."""
    if continue_final and isinstance(messages, list) and messages and isinstance(messages[-1], dict):
        content = _text(messages, len(messages) - 1)
        marked = [*messages[:-1], {**messages[-1], "content": CONTINUE_MARK}]
        text = render_with_tools(template, marked, tools, False, variables=variables, **extra)
        cut = text.rfind(CONTINUE_MARK)
        if cut < 0:
            raise bad_request("continue_final_message: the chat template does not render the final message")
        return text[:cut] + content
    try:
        if isinstance(messages, list) and template.supports_tools:
            native = tools is not None and tools.active
            return template.render(_native(messages), add_generation_prompt, variables,
                                   **({"tools": list(tools.tools)} if native else {}), **extra)
        msgs = _fallback(messages, tools) if isinstance(messages, list) else messages
        return template.render(msgs, add_generation_prompt, variables, **extra)
    except ChatTemplateError as e:
        raise bad_request(str(e)) from None
