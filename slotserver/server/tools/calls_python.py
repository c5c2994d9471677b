"""LFM2's tool calls (LFM2, LFM2.5, LFM2-MoE: templates with `<|tool_list_start|>`): a Python-style
list of calls between two markers, parsed with Python's own parser and nothing else evaluated.

    <|tool_call_start|>[get_weather(city="Paris", days=3), get_time(zone="CET")]<|tool_call_end|>

As llama.cpp's LFM2 parser (common/parsers/lfm2.cpp, `python_style_tool_calls` with JSON literals
allowed) reads them: keyword arguments only, each a Python literal (strings in either quote,
numbers, lists, dicts, True/False/None) or JSON's true/false/null; a plain function name of an
offered function. A block may hold several calls: all are kept (as Mistral's array), and without
`parallel_tool_calls` nothing after the first block is a call. A block that is not such a list (a
positional argument, an expression, a name not offered, a key twice) stays content.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import Any

from slotserver.server.tools.calls import HermesParser, make_call

OPEN, CLOSE = "<|tool_call_start|>", "<|tool_call_end|>"
JSON_WORDS = {"true": True, "false": False, "null": None}
_BAD = object()


class _JsonWords(ast.NodeTransformer):
    """JSON's true/false/null as the constants they mean (names are not literals to literal_eval)."""

    def visit_Name(self, node: ast.Name) -> ast.AST:
        return ast.Constant(JSON_WORDS[node.id]) if node.id in JSON_WORDS else node


def _literal(node: ast.AST) -> Any:
    try:
        return ast.literal_eval(_JsonWords().visit(node))
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return _BAD


def pythonic_calls(body: str, names: tuple[str, ...]) -> list[tuple[str, dict]] | None:
    """`[name(key=value, ...), ...]` (or one call without the brackets) -> [(name, arguments)], or None."""
    try:
        node = ast.parse(body.strip(), mode="eval").body
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return None
    out = []
    for item in node.elts if isinstance(node, ast.List) else [node]:
        if not isinstance(item, ast.Call) or not isinstance(item.func, ast.Name) or item.args \
                or item.func.id not in names:
            return None
        args: dict[str, Any] = {}
        for kw in item.keywords:
            value = _literal(kw.value)
            if kw.arg is None or kw.arg in args or value is _BAD:
                return None
            args[kw.arg] = value
        out.append((item.func.id, args))
    return out or None


@dataclass
class PythonicParser(HermesParser):
    OPEN = OPEN
    CLOSE = CLOSE

    def _calls(self, body: str) -> list[dict] | None:
        calls = pythonic_calls(body, self.tools.names)
        return None if calls is None else [make_call(name, args) for name, args in calls]
