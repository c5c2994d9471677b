"""OpenAI function calling, the request side: `tools`, `tool_choice`, `parallel_tool_calls`.

The call format is Hermes / Qwen 2.5's (what llama.cpp's hermes handler parses, and what the
fallback prompt in tool_prompt.py teaches a model whose template has no tool support, such as the
default SmolLM2):

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

`tool_choice`:
- "auto" (the default with tools): the model may answer or call; calls are parsed out of its text
  (tool_calls.py), and a call that does not parse stays in the content, never dropped;
- "none": the tools are neither shown to the model nor parsed (plain chat);
- "required" or {"type": "function", "function": {"name": ...}}: the output is forced through a
  grammar built from the tools' parameter schemas (as vLLM does), so even a small model returns a
  call that parses and matches its schema.
`parallel_tool_calls` (llama-server's default, false): at most one call; true: one or more.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from slotserver.engine.grammar import JSON_OPTIONS
from slotserver.server.errors import bad_request
from slotserver.server.fields import Fields

OPEN, CLOSE = "<tool_call>", "</tool_call>"


@dataclass(frozen=True)
class ToolConfig:
    tools: tuple[dict, ...]         # the request's tools, validated ({type: function, function: {...}})
    choice: str                     # "auto", "none", "required" or "named"
    name: str | None = None         # the forced function with a named tool_choice
    parallel: bool = False

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(t["function"]["name"] for t in self.tools)

    @property
    def active(self) -> bool:
        """Tools are shown to the model and its calls parsed."""
        return bool(self.tools) and self.choice != "none"

    @property
    def forced(self) -> bool:
        return self.active and self.choice in ("required", "named")


def _tool(i: int, tool: Any) -> dict:
    if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(tool.get("function"), dict):
        raise bad_request(f"'tools[{i}]' must be {{\"type\": \"function\", \"function\": {{name, parameters}}}}")
    fn = tool["function"]
    if not isinstance(fn.get("name"), str) or not fn["name"]:
        raise bad_request(f"'tools[{i}].function.name' must be a non-empty string")
    params = fn.get("parameters", {"type": "object", "properties": {}})
    if not isinstance(params, dict):
        raise bad_request(f"'tools[{i}].function.parameters' must be a JSON Schema object")
    if fn.get("description") is not None and not isinstance(fn["description"], str):
        raise bad_request(f"'tools[{i}].function.description' must be a string")
    return {"type": "function", "function": {**fn, "parameters": params}}


def _choice(value: Any, names: tuple[str, ...]) -> tuple[str, str | None]:
    if value is None:
        return "auto", None
    if value in ("auto", "none", "required"):
        return value, None
    if isinstance(value, dict) and value.get("type") == "function" and isinstance(value.get("function"), dict):
        name = value["function"].get("name")
        if name not in names:
            raise bad_request(f"'tool_choice' names the function {name!r}, which is not in 'tools'")
        return "named", name
    raise bad_request("'tool_choice' must be \"auto\", \"none\", \"required\" or "
                      "{\"type\": \"function\", \"function\": {\"name\": ...}}")


def parse_tools(f: Fields) -> ToolConfig:
    raw = f.raw("tools", [])
    if not isinstance(raw, list):
        raise bad_request("'tools' must be an array of function tools")
    tools = tuple(_tool(i, t) for i, t in enumerate(raw))
    names = tuple(t["function"]["name"] for t in tools)
    if len(set(names)) != len(names):
        raise bad_request("'tools' names a function more than once")
    choice, name = _choice(f.raw("tool_choice"), names)
    if choice != "auto" and choice != "none" and not tools:
        raise bad_request("'tool_choice' requires 'tools'")
    return ToolConfig(tools, choice, name, f.bool("parallel_tool_calls", False))


def call_schema(tools: ToolConfig) -> dict:
    """JSON Schema of one call's object: {"name": one of the allowed functions, "arguments": its parameters}."""
    allowed = [t for t in tools.tools if tools.choice != "named" or t["function"]["name"] == tools.name]
    options = [{"type": "object", "additionalProperties": False, "required": ["name", "arguments"],
                "properties": {"name": {"const": t["function"]["name"]}, "arguments": t["function"]["parameters"]}}
               for t in allowed]
    schema = options[0] if len(options) == 1 else {"anyOf": options}
    return {**schema, "x-guidance": JSON_OPTIONS}


def forced_call_grammar(tools: ToolConfig) -> str:
    """A Lark grammar (llguidance) for "required"/named: one call, or several with parallel_tool_calls."""
    schema = json.dumps(call_schema(tools))
    rep = ' ("\\n" call)*' if tools.parallel else ""
    return (f'start: call{rep}\n'
            f'call: "{OPEN}\\n" json_call "\\n{CLOSE}"\n'
            f'json_call: %json {schema}\n')
