"""LFM2's tool calls (LFM2, LFM2.5, LFM2-MoE: templates with `<|tool_list_start|>`): a Python-style
list of calls between two markers, parsed with Python's own parser and nothing else evaluated.

    <|tool_call_start|>[get_weather(city="Paris", days=3), get_time(zone="CET")]<|tool_call_end|>

As llama.cpp's LFM2 parser (common/parsers/lfm2.cpp, `python_style_tool_calls` with JSON literals
allowed) reads them: an offered function's name as written, keyword arguments only (their names
as written too: `from=`, `user-id=`), each value a Python literal (strings in either quote,
numbers, lists, dicts, True/False/None) or JSON's true/false/null that JSON can carry (no bytes,
sets, complex numbers, infinities). Only each value goes through Python's parser, and nothing is
evaluated. A block may hold several calls: all are kept (as Mistral's array), and without
`parallel_tool_calls` nothing after the first block is a call. A block that is not such a list (a
positional argument, an expression, a name not offered, a key twice) stays content.
"""

from __future__ import annotations

import ast
import math
import re
import warnings
from dataclasses import dataclass
from typing import Any

from slotserver.server.tools.calls import HermesParser, make_call

OPEN, CLOSE = "<|tool_call_start|>", "<|tool_call_end|>"
JSON_WORDS = {"true": True, "false": False, "null": None}
_BAD = object()
_KEY = re.compile(r"\s*([^\s=,()\[\]{}'\"]+)\s*=\s*")   # an argument's name, then "=": any offered key
_CLOSERS = {"(": ")", "[": "]", "{": "}"}


class _JsonWords(ast.NodeTransformer):
    """JSON's true/false/null as the constants they mean (names are not literals to literal_eval)."""

    def visit_Name(self, node: ast.Name) -> ast.AST:
        return ast.Constant(JSON_WORDS[node.id]) if node.id in JSON_WORDS else node


def _literal(text: str) -> Any:
    """One argument's value: a Python literal (or JSON's words) that JSON can carry, else _BAD."""
    try:
        with warnings.catch_warnings():   # an odd escape ("\d") warns on 3.12: no call is made of a warning
            warnings.simplefilter("ignore")
            node = ast.parse(text.strip(), mode="eval").body
        value = ast.literal_eval(_JsonWords().visit(node))
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return _BAD
    return value if _jsonable(value) else _BAD


def _jsonable(value: Any, depth: int = 0) -> bool:
    """What json.dumps writes as JSON: strings, integers, finite floats, booleans, None, and lists,
    tuples and string-keyed dicts of them (not bytes, sets, complex numbers, inf, huge integers)."""
    if depth > 100:
        return False
    if value is None or isinstance(value, (bool, str)):
        return True
    if isinstance(value, int):
        return value.bit_length() < 10_000   # (str() of more than 4300 digits raises)
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, (list, tuple)):
        return all(_jsonable(v, depth + 1) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and _jsonable(v, depth + 1) for k, v in value.items())
    return False


def _value_end(text: str, i: int) -> int:
    """Where the value starting at `i` ends: the first `,` or `)` outside quotes and brackets."""
    stack, quote = [], ""
    while i < len(text):
        c = text[i]
        if quote:
            if c == "\\":
                i += 1
            elif c == quote:
                quote = ""
        elif c in "'\"":
            quote = c
        elif c in _CLOSERS:
            stack.append(_CLOSERS[c])
        elif stack and c == stack[-1]:
            stack.pop()
        elif not stack and c in ",)":
            return i
        i += 1
    return i


def _one_call(text: str, i: int, names: tuple[str, ...]) -> tuple[tuple[str, dict], int] | None:
    """The call at `i` (an offered name, matched as written, then `(key=value, ...)`) -> (call, end)."""
    name = next((n for n in sorted(names, key=len, reverse=True) if text.startswith(n + "(", i)), None)
    if name is None:
        return None
    i, args = i + len(name) + 1, {}
    while True:
        while i < len(text) and text[i].isspace():
            i += 1
        if text.startswith(")", i):
            return (name, args), i + 1
        m = _KEY.match(text, i)
        if m is None or m.group(1) in args:
            return None
        end = _value_end(text, m.end())
        value = _literal(text[m.end(): end])
        if value is _BAD or end >= len(text):
            return None
        args[m.group(1)] = value
        i = end + 1 if text[end] == "," else end


def pythonic_calls(body: str, names: tuple[str, ...]) -> list[tuple[str, dict]] | None:
    """`[name(key=value, ...), ...]` (or one call without the brackets) -> [(name, arguments)], or None.
    Names and keys are matched as written (a hyphen, a dot, a Python keyword as in `from=`), as
    llama.cpp's parser matches the offered ones; each value alone goes through Python's parser."""
    text = body.strip()
    listed = text.startswith("[") and text.endswith("]")
    text, i, out = (text[1:-1] if listed else text), 0, []
    while True:
        while i < len(text) and text[i].isspace():
            i += 1
        found = _one_call(text, i, names)
        if found is None:
            return None
        out.append(found[0])
        i = found[1]
        while i < len(text) and text[i].isspace():
            i += 1
        if i == len(text):
            return out
        if text[i] != "," or not listed:
            return None
        i += 1


@dataclass
class PythonicParser(HermesParser):
    OPEN = OPEN
    CLOSE = CLOSE

    def _calls(self, body: str) -> list[dict] | None:
        calls = pythonic_calls(body, self.tools.names)
        return None if calls is None else [make_call(name, args) for name, args in calls]
