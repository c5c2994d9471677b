"""The model's text -> OpenAI `tool_calls`, whole or streamed (Hermes `<tool_call>` blocks).

`ToolCallParser.feed(text)` takes the generated text as it arrives and returns what is safe to
send: content (text outside any call, a possible start of `<tool_call>` held back until it is
decided) and calls (each when its block closes, or at the end for an unclosed last block).
A block whose JSON does not parse, or names no offered function, is given back as content:
never dropped. Without `parallel_tool_calls` only the first call is a call; what follows it is
content, as llama-server does.

Calls are OpenAI's objects: {"id": "call_...", "type": "function", "function": {"name",
"arguments": a JSON string}}; streamed, each call is two deltas as OpenAI sends them: the header
(index, id, type, name, arguments "") and then its arguments.
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass, field

from slotserver.server.tools import CLOSE, OPEN, ToolConfig


def _call(obj: object, names: tuple[str, ...]) -> dict | None:
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
    return {"id": "call_" + secrets.token_hex(12), "type": "function",
            "function": {"name": obj["name"], "arguments": json.dumps(args, ensure_ascii=False)}}


def parse_call(block: str, names: tuple[str, ...]) -> dict | None:
    """The body of one `<tool_call>` block -> an OpenAI call, or None if it is not one."""
    try:
        return _call(json.loads(block.strip()), names)
    except json.JSONDecodeError:
        return None


def _partial_open(text: str) -> int:
    """Length of the longest suffix of `text` that starts `<tool_call>` (to hold back)."""
    for n in range(min(len(OPEN) - 1, len(text)), 0, -1):
        if OPEN.startswith(text[-n:]):
            return n
    return 0


@dataclass
class ToolCallParser:
    tools: ToolConfig
    calls: list[dict] = field(default_factory=list)
    _buf: str = ""
    _in_call: bool = False
    _done: bool = False         # without parallel calls: the first call closes the door

    def feed(self, text: str, final: bool = False) -> tuple[str, list[dict]]:
        """-> (content to send now, calls completed now)."""
        self._buf += text
        content, new = [], []
        while True:
            if self._done:
                content.append(self._buf)
                self._buf = ""
                break
            if not self._in_call:
                i = self._buf.find(OPEN)
                if i < 0:
                    keep = 0 if final else _partial_open(self._buf)
                    content.append(self._buf[: len(self._buf) - keep])
                    self._buf = self._buf[len(self._buf) - keep:]
                    break
                content.append(self._buf[:i])
                self._buf, self._in_call = self._buf[i:], True
            j = self._buf.find(CLOSE)
            if j < 0 and not final:
                break
            block = self._buf[len(OPEN): j if j >= 0 else len(self._buf)]
            end = j + len(CLOSE) if j >= 0 else len(self._buf)
            call = parse_call(block, self.tools.names)
            if call is None:
                content.append(self._buf[:end])
            else:
                new.append(call)
                self._done = not self.tools.parallel
            self._buf, self._in_call = self._buf[end:], False
            if final and not self._buf:
                break
        self.calls.extend(new)
        return "".join(content), new

    def parse(self, text: str) -> tuple[str, list[dict]]:
        """A whole answer -> (content, calls); content is stripped around calls."""
        content, calls = self.feed(text, final=True)
        return (content.strip() if calls else content), calls


def stream_deltas(index0: int, call: dict) -> list[dict]:
    """The `delta.tool_calls` entries for one call, as OpenAI streams it."""
    head = {"index": index0, "id": call["id"], "type": "function",
            "function": {"name": call["function"]["name"], "arguments": ""}}
    return [head, {"index": index0, "function": {"arguments": call["function"]["arguments"]}}]
