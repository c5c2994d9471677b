"""Parsers of the XML call formats: Qwen3-Coder's (Qwen3-Coder, Qwen3.5, Nemotron 3 Nano), Seed-OSS's
and GLM's (formats.py). Each is the Hermes parser (calls.py: blocks anywhere in the answer, streamed
a call at a time when its block closes, a block that is no call given back as content) with its own
markers and block body:

    qwen3_coder  <tool_call>\\n<function=NAME>\\n<parameter=KEY>\\nVALUE\\n</parameter>\\n...</function>\\n</tool_call>
    seed_oss     <seed:tool_call>\\n<function=NAME>\\n<parameter=KEY>VALUE</parameter>\\n...</function>\\n</seed:tool_call>
    glm          <tool_call>NAME\\n<arg_key>KEY</arg_key>\\n<arg_value>VALUE</arg_value>\\n...</tool_call>

A value is raw text: as the templates render a call (a string argument as it is, anything else as
JSON) it is read back, as vLLM's and llama.cpp's parsers do: a parameter the function's schema types
as a string keeps its text (one newline either side dropped, which the Qwen form adds), any other
is decoded as JSON where it decodes, else kept as text. A function the request did not offer, an
argument twice, or text that is no such block: not a call (content, as Hermes' parser gives it).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from slotserver.server.tools.calls import HermesParser, make_call

_FUNCTION = re.compile(r"\s*<function=([^>\n]+)>(.*?)</function>\s*\Z", re.S)
_PARAMETER = re.compile(r"<parameter=([^>\n]+)>(.*?)</parameter>", re.S)
_ARG = re.compile(r"<arg_key>(.*?)</arg_key>\s*<arg_value>(.*?)</arg_value>", re.S)


def typed_value(text: str, schema: Any) -> Any:
    """A parameter's text as its schema reads it: a string parameter's text as it is, else JSON
    where it decodes (numbers, booleans, objects, arrays, null), else the text."""
    types = schema.get("type") if isinstance(schema, dict) else None
    if types == "string" or (isinstance(types, list) and set(types) <= {"string", "null"} and "string" in types):
        return text
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def _arguments(pairs: list[tuple[str, str]], properties: dict, strip_newlines: bool) -> dict | None:
    """(key, raw value) pairs -> the call's arguments, or None where a key repeats."""
    args: dict[str, Any] = {}
    for key, raw in pairs:
        key = key.strip()
        if key in args:
            return None
        if strip_newlines:
            raw = raw[1:] if raw.startswith("\n") else raw
            raw = raw[:-1] if raw.endswith("\n") else raw
        args[key] = typed_value(raw, properties.get(key))
    return args


@dataclass
class QwenXmlParser(HermesParser):
    """`<tool_call>` blocks holding one `<function=NAME>` block of `<parameter=KEY>` blocks."""

    def _call(self, body: str) -> dict | None:
        m = _FUNCTION.match(body)
        if m is None or m.group(1).strip() not in self.tools.names:
            return None
        name = m.group(1).strip()
        inner = m.group(2)
        pairs = _PARAMETER.findall(inner)
        if _PARAMETER.sub("", inner).strip():   # text between the parameters: not this format
            return None
        args = _arguments(pairs, _properties(self.tools, name), strip_newlines=True)
        return None if args is None else make_call(name, args)


@dataclass
class SeedXmlParser(QwenXmlParser):
    OPEN = "<seed:tool_call>"
    CLOSE = "</seed:tool_call>"


@dataclass
class GlmParser(HermesParser):
    """`<tool_call>` blocks: the function's name, then `<arg_key>` / `<arg_value>` pairs."""

    def _call(self, body: str) -> dict | None:
        head, _, rest = body.partition("<arg_key>")
        name = head.strip()
        if name not in self.tools.names:
            return None
        rest = "<arg_key>" + rest if rest else ""
        if _ARG.sub("", rest).strip():   # text outside the pairs: not this format
            return None
        args = _arguments(_ARG.findall(rest), _properties(self.tools, name), strip_newlines=False)
        return None if args is None else make_call(name, args)


def _properties(tools, name: str) -> dict:
    """The offered function's parameter schemas by name ({} where it declares none)."""
    fn = next(t["function"] for t in tools.tools if t["function"]["name"] == name)
    props = (fn.get("parameters") or {}).get("properties")
    return props if isinstance(props, dict) else {}
