"""OpenAI function calling, the request side: `tools`, `tool_choice`, `parallel_tool_calls`.

The call format (Hermes `<tool_call>` blocks, Llama 3.x JSON, Mistral Nemo `[TOOL_CALLS]`, or
llama.cpp's generic JSON) comes from the model's chat template (formats.py); the request's
fields mean the same in every format.

`tool_choice`:
- "auto" (the default with tools): the model may answer or call; calls are parsed out of its text
  (calls.py, calls_json.py), and a call that does not parse stays in the content, never
  dropped (the generic format is the exception: its answers always go through its grammar, which
  lets the model answer with {"response": ...} or call);
- "none": the tools are neither shown to the model nor parsed (plain chat);
- "required" or {"type": "function", "function": {"name": ...}}: the output is forced through a
  grammar built from the tools' parameter schemas (grammar.py, as vLLM does), so even a small
  model returns a call that parses and matches its schema.
`parallel_tool_calls` (llama-server's default, false): at most one call; true: one or more
(Llama 3.x templates render one call per turn: one call there, as llama.cpp).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from slotserver.server.errors import bad_request
from slotserver.server.fields import Fields
from slotserver.server.tools.formats import GENERIC, HERMES, choose_format


@dataclass(frozen=True)
class ToolConfig:
    tools: tuple[dict, ...]         # the request's tools, validated ({type: function, function: {...}})
    choice: str                     # "auto", "none", "required" or "named"
    name: str | None = None         # the forced function with a named tool_choice
    parallel: bool = False
    format: str = HERMES            # the call format (formats.py)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(t["function"]["name"] for t in self.tools)

    @property
    def active(self) -> bool:
        """Tools are shown to the model and its calls parsed."""
        return bool(self.tools) and self.choice != "none"

    @property
    def forced(self) -> bool:
        """The output goes through a grammar: "required" / named, and every answer of the generic
        format (one JSON object: a call or {"response": ...}, as llama.cpp constrains it)."""
        return self.active and (self.choice in ("required", "named") or self.format == GENERIC)

    @property
    def allowed(self) -> tuple[dict, ...]:
        """The tools a call may name: all, or the one a named tool_choice forces."""
        return tuple(t for t in self.tools if self.choice != "named" or t["function"]["name"] == self.name)


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


def parse_tools(f: Fields, template_source: str | None = None, preference: str = "auto") -> ToolConfig:
    """The request's tool fields; the call format is the template's (`preference`: the server's
    --tool-call-format)."""
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
    return ToolConfig(tools, choice, name, f.bool("parallel_tool_calls", False),
                      choose_format(template_source, preference))

