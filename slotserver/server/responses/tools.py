"""The Responses API's `tools` and `tool_choice` -> chat completions' (tools/request.py takes them).

Responses function tools are flat: {type: "function", name, description, parameters, strict};
chat nests them under `function`. `parameters` may be null (no arguments) and `strict` defaults
to true, as in OpenAI's API and llama-server's conversion. The chat shape is accepted too.
The hosted tools (web_search, file_search, computer_use, code_interpreter, mcp, custom, ...) need
OpenAI's servers: a 400 naming the tool (llama-server skips them with a warning; a request that
counts on one would get an answer made without it).

`tool_choice`: "auto" | "none" | "required" as in chat; {type: "function", name} forces that
function; {type: "allowed_tools", mode: "auto" | "required", tools: [{type: "function", name}]}
offers only the listed functions (OpenAI keeps the others in the prompt for its cache; here they
are left out, which the model cannot tell apart).
"""

from __future__ import annotations

from typing import Any

from slotserver.server.errors import bad_request
from slotserver.server.fields import Fields

NO_ARGUMENTS = {"type": "object", "properties": {}}


def _tool(i: int, tool: Any) -> dict:
    """One Responses tool (or chat-shaped tool) -> the flat Responses shape, validated."""
    where = f"tools[{i}]"
    if not isinstance(tool, dict):
        raise bad_request(f"'{where}' must be an object {{type: \"function\", name, parameters}}")
    if tool.get("type") != "function":
        raise bad_request(f"'{where}.type' {tool.get('type')!r} is not supported: only function tools are "
                          "(hosted tools need OpenAI's servers)")
    if isinstance(tool.get("function"), dict):   # the chat shape
        tool = {"type": "function", **tool["function"]}
    if not isinstance(tool.get("name"), str) or not tool["name"]:
        raise bad_request(f"'{where}.name' must be a non-empty string")
    params = tool.get("parameters")
    if params is not None and not isinstance(params, dict):
        raise bad_request(f"'{where}.parameters' must be a JSON Schema object or null")
    if tool.get("description") is not None and not isinstance(tool["description"], str):
        raise bad_request(f"'{where}.description' must be a string")
    strict = tool.get("strict")
    if strict is not None and not isinstance(strict, bool):
        raise bad_request(f"'{where}.strict' must be true or false")
    return {**tool, "parameters": params if params is not None else NO_ARGUMENTS,
            "strict": True if strict is None else strict}


def _chat_tool(tool: dict) -> dict:
    fn = {k: v for k, v in tool.items() if k != "type"}
    return {"type": "function", "function": fn}


def _named(value: dict) -> str:
    name = value.get("name")
    if name is None and isinstance(value.get("function"), dict):   # the chat shape
        name = value["function"].get("name")
    if not isinstance(name, str) or not name:
        raise bad_request("'tool_choice.name' must be the name of a function in 'tools'")
    return name


def _allowed(value: dict, tools: list[dict]) -> tuple[list[dict], str]:
    """allowed_tools -> (the offered tools, "auto" or "required")."""
    mode, listed = value.get("mode", "auto"), value.get("tools")
    if mode not in ("auto", "required"):
        raise bad_request("'tool_choice.mode' must be \"auto\" or \"required\"")
    if not isinstance(listed, list) or not listed:
        raise bad_request("'tool_choice.tools' must be a non-empty list of {type: \"function\", name}")
    names = set()
    for j, t in enumerate(listed):
        if not isinstance(t, dict) or t.get("type") != "function" or not isinstance(t.get("name"), str):
            raise bad_request(f"'tool_choice.tools[{j}]' must be {{type: \"function\", name}}: only function "
                              "tools are supported")
        names.add(t["name"])
    missing = names - {t["name"] for t in tools}
    if missing:
        raise bad_request(f"'tool_choice.tools' names {sorted(missing)[0]!r}, which is not in 'tools'")
    return [t for t in tools if t["name"] in names], mode


def _choice(value: Any, tools: list[dict]) -> tuple[list[dict], Any]:
    """(tools offered, chat tool_choice) for a Responses tool_choice."""
    if value is None or value in ("auto", "none", "required"):
        return tools, value
    kind = value.get("type") if isinstance(value, dict) else None
    if kind == "function":
        return tools, {"type": "function", "function": {"name": _named(value)}}
    if kind == "allowed_tools":
        return _allowed(value, tools)
    raise bad_request("'tool_choice' must be \"auto\", \"none\", \"required\", {type: \"function\", name} or "
                      "{type: \"allowed_tools\", mode, tools}; "
                      f"got {str(value)[:80]} (hosted tools are not supported)")


def convert_tools(f: Fields) -> tuple[list[dict] | None, Any, list[dict], Any]:
    """-> (chat tools or None, chat tool_choice or None, the Responses tools echoed, the
    tool_choice echoed ("auto" when absent))."""
    raw = f.raw("tools", [])
    if not isinstance(raw, list):
        raise bad_request("'tools' must be a list of function tools")
    tools = [_tool(i, t) for i, t in enumerate(raw)]
    choice_value = f.raw("tool_choice")
    offered, choice = _choice(choice_value, tools)
    chat_tools = [_chat_tool(t) for t in offered] or None
    return chat_tools, choice, tools, choice_value if choice_value is not None else "auto"
