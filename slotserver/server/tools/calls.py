"""The model's text -> OpenAI `tool_calls`, whole or streamed: what every format's parser shares,
and the Hermes `<tool_call>` parser (the JSON formats: calls_json.py).

A parser's `feed(text)` takes the generated text as it arrives and returns what is safe to send:
content (text outside any call; text that may still turn out to start a call is held back until
it is decided) and calls (each when its block is complete, or at the end for an unclosed last
block). `parse(text)` is `feed(text, final=True)`: the same code path, so a streamed answer gives
the same content and calls as the whole one. A block whose JSON does not parse, or names no
offered function, is given back as content: never dropped.

Calls are OpenAI's objects: {"id": "call_...", "type": "function", "function": {"name",
"arguments": a JSON string}}; streamed, each call is two deltas as OpenAI sends them: the header
(index, id, type, name, arguments "") and then its arguments.
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass, field
from typing import ClassVar

from slotserver.server.tools.formats import CLOSE, OPEN
from slotserver.server.tools.request import ToolConfig


def make_call(name: str, args: dict, call_id: str | None = None) -> dict:
    return {"id": call_id or "call_" + secrets.token_hex(12), "type": "function",
            "function": {"name": name, "arguments": json.dumps(args, ensure_ascii=False)}}


def call_from(obj: object, names: tuple[str, ...], call_id: str | None = None) -> dict | None:
    """{"name", "arguments"} (Llama's "parameters"; arguments as an object or a JSON string)
    naming an offered function -> an OpenAI call, else None."""
    if not isinstance(obj, dict) or obj.get("name") not in names:
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except json.JSONDecodeError:
            return None
    if not isinstance(args, dict):
        return None
    return make_call(obj["name"], args, call_id)


def partial_suffix(text: str, marker: str) -> int:
    """Length of the longest suffix of `text` that starts `marker` (to hold back)."""
    for n in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-n:]):
            return n
    return 0


@dataclass
class CallParser:
    """What every format's parser keeps: the calls so far, the text not yet decided."""

    tools: ToolConfig
    calls: list[dict] = field(default_factory=list)
    _buf: str = ""
    _done: bool = False         # no call can follow (without parallel calls: after the first)

    def feed(self, text: str, final: bool = False) -> tuple[str, list[dict]]:
        """-> (content to send now, calls completed now)."""
        raise NotImplementedError

    def parse(self, text: str) -> tuple[str, list[dict]]:
        """A whole answer -> (content, calls); content is stripped around calls."""
        content, calls = self.feed(text, final=True)
        return (content.strip() if calls else content), calls


def parse_call(block: str, names: tuple[str, ...]) -> dict | None:
    """The body of one `<tool_call>` block -> an OpenAI call, or None if it is not one."""
    try:
        return call_from(json.loads(block.strip()), names)
    except json.JSONDecodeError:
        return None


@dataclass
class HermesParser(CallParser):
    """`<tool_call>` blocks anywhere in the answer. Without `parallel_tool_calls` only the first
    call is a call; what follows it is content, as llama-server does. The XML formats' parsers
    (calls_xml.py) are this one with their own markers and block bodies (`OPEN`, `CLOSE`, `_call`)."""

    _in_call: bool = False
    _skip: int = 0              # the open block's marker length (what `_call` does not see)
    _close: str = CLOSE         # the open block's closing marker
    _bare: int = 0              # a bare block (calls_xml.py): its opener's length, 0 for a marked one
    OPEN: ClassVar[str] = OPEN
    CLOSE: ClassVar[str] = CLOSE

    def _call(self, body: str) -> dict | None:
        """A block's body -> an OpenAI call, or None (the block is then content)."""
        return parse_call(body, self.tools.names)

    def _calls(self, body: str) -> list[dict] | None:
        """A block's calls (one here; LFM2's blocks hold a list: calls_python.py), or None."""
        call = self._call(body)
        return None if call is None else [call]

    def _openers(self) -> tuple[tuple[str, int, str], ...]:
        """(what opens a block, how much of it the body skips, what closes it): `OPEN`'s blocks;
        calls_xml.py's Qwen parser adds bare `<function=NAME>` blocks."""
        return ((self.OPEN, len(self.OPEN), self.CLOSE),)   # (skip 0: a bare block, opener and all)

    def _outside(self, final: bool, content: list[str]) -> bool:
        """Text before the next block goes to content; False when no block starts (yet)."""
        found = [(i, skip, close) for marker, skip, close in self._openers() if (i := self._buf.find(marker)) >= 0]
        if not found:
            keep = 0 if final else max(partial_suffix(self._buf, marker) for marker, _, _ in self._openers())
            content.append(self._buf[: len(self._buf) - keep])
            self._buf = self._buf[len(self._buf) - keep:]
            return False
        i, self._skip, self._close = min(found)
        self._bare = 0 if self._skip else next(len(m) for m, skip, _ in self._openers()
                                                if not skip and self._buf.startswith(m, i))
        content.append(self._buf[:i])
        self._buf, self._in_call = self._buf[i:], True
        return True

    def feed(self, text: str, final: bool = False) -> tuple[str, list[dict]]:
        self._buf += text
        content, new = [], []
        while True:
            if self._done:
                content.append(self._buf)
                self._buf = ""
                break
            if not self._in_call and not self._outside(final, content):
                break
            j = self._buf.find(self._close)
            if j < 0 and not final:
                break
            end = j + len(self._close) if j >= 0 else len(self._buf)
            body = self._buf[self._skip: j if j >= 0 else len(self._buf)]
            calls = self._calls(body + self._close if j >= 0 and not self._skip else body)   # (a bare block: whole)
            if calls is None and self._bare:   # a bare opener in prose: text, and the search goes on after it
                content.append(self._buf[:self._bare])
                self._buf, self._in_call = self._buf[self._bare:], False
                continue
            if calls is None:
                content.append(self._buf[:end])
            else:
                new.extend(calls)
                self._done = not self.tools.parallel
            self._buf, self._in_call = self._buf[end:], False
            if final and not self._buf:
                break
        self.calls.extend(new)
        return "".join(content), new


def stream_deltas(index0: int, call: dict) -> list[dict]:
    """The `delta.tool_calls` entries for one call, as OpenAI streams it."""
    head = {"index": index0, "id": call["id"], "type": "function",
            "function": {"name": call["function"]["name"], "arguments": ""}}
    return [head, {"index": index0, "function": {"arguments": call["function"]["arguments"]}}]
