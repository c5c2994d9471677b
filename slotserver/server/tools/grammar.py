"""The grammar (llguidance Lark with embedded JSON schemas) that forces a tool call in each format.

Used for tool_choice "required" or a named function, and for every answer of the generic format.
Each call's JSON comes from the tools' own parameter schemas, so the call always parses and
matches (as vLLM does; llama.cpp builds the same shapes in GBNF): the function name is a `const`,
the arguments are that function's `parameters`, nothing else is allowed in the call object. JSON
is compact with llama.cpp's separators (engine/grammar.py JSON_OPTIONS).

The formats' markers are written as text: a vocabulary whose `[TOOL_CALLS]` or `<tool_call>` is a
control token spells it with plain tokens under the grammar (control tokens never match grammar
text), which detokenizes to the same marker for the parser.
"""

from __future__ import annotations

import json
from collections.abc import Callable

from slotserver.engine.grammar import JSON_OPTIONS
from slotserver.server.tools.formats import (CLOSE, GENERIC, HARMONY, HERMES, LLAMA3, MISTRAL, MISTRAL_ID, MISTRAL_MARKER,
                                             OPEN)
from slotserver.server.tools.request import ToolConfig

ID_SCHEMA = {"type": "string", "pattern": f"^{MISTRAL_ID}$"}   # what Nemo's template demands


def _one_of(options: list[dict]) -> dict:
    return options[0] if len(options) == 1 else {"anyOf": options}


def call_schema(tools: ToolConfig, args_key: str = "arguments", extra: dict | None = None) -> dict:
    """JSON Schema of one call's object: {"name": one of the allowed functions, args_key: its
    parameters, and the `extra` properties (all required)}."""
    options = []
    for t in tools.allowed:
        props = {"name": {"const": t["function"]["name"]}, args_key: t["function"]["parameters"], **(extra or {})}
        options.append({"type": "object", "additionalProperties": False, "required": list(props),
                        "properties": props})
    return _one_of(options)


def _json_rule(name: str, schema: dict) -> str:
    return f"{name}: %json {json.dumps({**schema, 'x-guidance': JSON_OPTIONS})}\n"


def hermes_grammar(tools: ToolConfig) -> str:
    """One `<tool_call>` block, or several on their own lines with parallel_tool_calls."""
    rep = ' ("\\n" call)*' if tools.parallel else ""
    return (f'start: call{rep}\n'
            f'call: "{OPEN}\\n" json_call "\\n{CLOSE}"\n' + _json_rule("json_call", call_schema(tools)))


def llama3_grammar(tools: ToolConfig) -> str:
    """The whole answer is one {"name", "parameters"} object (Llama 3.x calls one at a time)."""
    return "start: json_call\n" + _json_rule("json_call", call_schema(tools, "parameters"))


def mistral_grammar(tools: ToolConfig) -> str:
    """`[TOOL_CALLS]` and an array of {"name", "arguments", "id"}: one item, or more with
    parallel_tool_calls."""
    array = {"type": "array", "items": call_schema(tools, extra={"id": ID_SCHEMA}), "minItems": 1}
    if not tools.parallel:
        array["maxItems"] = 1
    return f'start: "{MISTRAL_MARKER}" json_calls\n' + _json_rule("json_calls", array)


def generic_schema(tools: ToolConfig) -> dict:
    """llama.cpp's generic answer: {"tool_call": call} ({"tool_calls": [call, ...]} with parallel
    calls), or, unless a call is forced, {"response": "text"}."""
    if tools.parallel:
        calls = {"type": "array", "items": call_schema(tools), "minItems": 1}
        call = {"type": "object", "additionalProperties": False, "required": ["tool_calls"],
                "properties": {"tool_calls": calls}}
    else:
        call = {"type": "object", "additionalProperties": False, "required": ["tool_call"],
                "properties": {"tool_call": call_schema(tools)}}
    if tools.choice in ("required", "named"):
        return call
    response = {"type": "object", "additionalProperties": False, "required": ["response"],
                "properties": {"response": {"type": "string"}}}
    return {"anyOf": [call, response]}


def generic_grammar(tools: ToolConfig) -> str:
    return "start: json_answer\n" + _json_rule("json_answer", generic_schema(tools))


def harmony_grammar(tools: ToolConfig) -> str:
    """gpt-oss: one message to the function, in the channel-header form llama.cpp's grammar allows
    (`<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>ARGS`); one call per turn."""
    rules = [f'call{i}: "<|channel|>commentary to=functions.{t["function"]["name"]} <|constrain|>json<|message|>" '
             f'args{i}\n' + _json_rule(f"args{i}", t["function"]["parameters"]) for i, t in enumerate(tools.allowed)]
    return "start: " + " | ".join(f"call{i}" for i in range(len(rules))) + "\n" + "".join(rules)


GRAMMARS: dict[str, Callable[[ToolConfig], str]] = {
    HERMES: hermes_grammar, LLAMA3: llama3_grammar, MISTRAL: mistral_grammar, GENERIC: generic_grammar,
    HARMONY: harmony_grammar}


def forced_call_grammar(tools: ToolConfig) -> str:
    """The Lark grammar (llguidance) of the request's forced output, in its call format."""
    return GRAMMARS[tools.format](tools)
