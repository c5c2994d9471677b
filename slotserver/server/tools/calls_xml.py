"""Parsers of the XML call formats: Qwen3-Coder's (Qwen3-Coder, Qwen3.5, Nemotron 3 Nano), Seed-OSS's
and GLM's (formats.py). Each is the Hermes parser (calls.py: blocks anywhere in the answer, streamed
a call at a time when its block closes, a block that is no call given back as content) with its own
markers and block body:

    qwen3_coder  <tool_call>\\n<function=NAME>\\n<parameter=KEY>\\nVALUE\\n</parameter>\\n...</function>\\n</tool_call>
    seed_oss     <seed:tool_call>\\n<function=NAME>\\n<parameter=KEY>VALUE</parameter>\\n...</function>\\n</seed:tool_call>
    glm          <tool_call>NAME\\n<arg_key>KEY</arg_key>\\n<arg_value>VALUE</arg_value>\\n...</tool_call>

A value is raw text: as the templates render a call (a string argument as it is, anything else as
JSON, or in Qwen3.5's and Seed's `|string`, Jinja's True/False/None) it is read back as llama.cpp's
parsers do (`typed_value`): its JSON value where that has a type the parameter's schema allows
(`type`, type lists, `anyOf`, `enum`), else its text where a string is allowed (one newline either
side dropped, which the Qwen form adds). A function the request did not offer, an
argument twice, or text that is no such block: not a call (content, as Hermes' parser gives it).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, ClassVar

from slotserver.server.tools.calls import HermesParser, make_call

_FUNCTION = re.compile(r"\s*<function=([^>\n]+)>(.*?)</function>\s*\Z", re.S)
_PARAMETER = re.compile(r"<parameter=([^>\n]+)>(.*?)</parameter>", re.S)
_ARG = re.compile(r"<arg_key>(.*?)</arg_key>\s*<arg_value>(.*?)</arg_value>", re.S)


JSON_TYPES = {bool: "boolean", int: "integer", float: "number", str: "string", list: "array", dict: "object",
              type(None): "null"}
PY_WORDS = {"True": "true", "False": "false", "None": "null"}   # what Jinja's `|string` writes for them


def value_types(schema: Any) -> frozenset[str] | None:
    """The JSON types a parameter's schema allows (`type`, a list of them, `anyOf`/`oneOf` members,
    `enum`/`const` values), or None where it says nothing readable (any value)."""
    if not isinstance(schema, dict):
        return None
    kind = schema.get("type")
    if isinstance(kind, str):
        return frozenset({kind})
    if isinstance(kind, list) and all(isinstance(k, str) for k in kind):
        return frozenset(kind)
    values = schema.get("enum") if isinstance(schema.get("enum"), list) else (
        [schema["const"]] if "const" in schema else None)
    if values is not None:
        return frozenset(JSON_TYPES.get(type(v), "string") for v in values)
    members = schema.get("anyOf") or schema.get("oneOf")
    if isinstance(members, list) and members:
        kinds = [value_types(m) for m in members]
        return None if None in kinds else frozenset().union(*kinds)
    return None


def takes_text(schema: Any) -> bool:
    """Whether a value of this schema is written as raw text (a string is possible, or the schema
    says nothing): the forced grammars' test (grammar.py), the same as the parser's below."""
    types = value_types(schema)
    return types is None or "string" in types


def typed_value(text: str, schema: Any) -> Any:
    """A parameter's text as its schema reads it, as llama.cpp's parsers do: its JSON value where
    that is of an allowed type (integers count as numbers; Jinja's `True`/`False`/`None`, which the
    Qwen3.5 and Seed templates write back into the history, as JSON's words), else the text where a
    string is allowed, else the JSON value where it decodes, else the text."""
    types = value_types(schema)
    for candidate in (text, PY_WORDS.get(text.strip())):
        if candidate is None:
            continue
        try:
            value = json.loads(candidate)
        except json.JSONDecodeError:
            continue
        kind = JSON_TYPES.get(type(value))
        if types is None or kind in types or (kind == "integer" and "number" in types):
            return text if types is None and isinstance(value, str) else value
    return text if types is None or "string" in types else _decoded(text)


def _decoded(text: str) -> Any:
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
    """`<tool_call>` blocks holding one `<function=NAME>` block of `<parameter=KEY>` blocks; and, as
    llama.cpp's parser takes them (Qwen3-Coder sometimes leaves out the `<tool_call>`), a bare
    `<function=NAME>` block naming an offered function."""

    BARE: ClassVar[bool] = True   # bare `<function=NAME>` blocks count (Seed's parser: no)

    def _openers(self) -> tuple[tuple[str, int, str], ...]:
        bare = tuple((f"<function={name}>", 0, "</function>") for name in self.tools.names) if self.BARE else ()
        return ((self.OPEN, len(self.OPEN), self.CLOSE), *bare)

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
    BARE = False


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
