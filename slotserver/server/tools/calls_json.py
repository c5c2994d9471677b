"""Parsers of the formats whose calls are one JSON value: Llama 3.x, Mistral Nemo, generic.

A block is an optional marker (`<|python_tag|>`, `[TOOL_CALLS]`) and one JSON value; it may open
at the start of the answer (leading whitespace allowed), and Mistral's marker also after content.
What the parser holds back, and why, so that streaming stays as live as the format allows:
- at the start, text that may still become a block: whitespace, a prefix of the marker, or the
  first characters of the call's JSON (`{"`, `[{"`); anything else is content at once, and for
  Llama 3.x and generic the rest of the answer is content too (their calls are the whole answer);
- a possible start of Mistral's marker at the end of the text (as the Hermes parser does);
- an open block, until its JSON closes (brackets counted outside strings, incrementally): only
  then is it known to be a call. Generic answers are a single JSON object, so their `response`
  text is sent when the object closes.
A block that does not decode into offered calls is given back as content, marker and all.
As llama.cpp: one block's calls are all kept (Mistral's array, generic's `tool_calls`); without
`parallel_tool_calls` nothing after the first block is a call.
"""

from __future__ import annotations

import json
import re
import secrets
from dataclasses import dataclass
from typing import ClassVar

from slotserver.server.tools.calls import CallParser, HermesParser, call_from, partial_suffix
from slotserver.server.tools.calls_python import PythonicParser
from slotserver.server.tools.calls_xml import GlmParser, QwenXmlParser, SeedXmlParser
from slotserver.server.tools.formats import (GENERIC, GLM, GRANITE, GRANITE_MARKER, HERMES, ID_CHARS, LFM2, LLAMA3,
                                             MISTRAL, MISTRAL_ID, MISTRAL_MARKER, PYTHON_TAG, QWEN_XML, SEED_XML)
from slotserver.server.tools.request import ToolConfig

NEMO_ID = re.compile(MISTRAL_ID)


def mistral_id(given: object = None) -> str:
    """The model's id when it has Nemo's form (9 letters or digits: the template refuses others
    when the call comes back in the history), else a new one."""
    if isinstance(given, str) and NEMO_ID.fullmatch(given):
        return given
    return "".join(secrets.choice(ID_CHARS) for _ in range(9))


def _opens(text: str, skeletons: tuple[str, ...]) -> tuple[bool | None, int]:
    """Does `text` open with one of `skeletons`' characters (whitespace allowed between them)?
    -> (True, index of the first) / (False, -1) / (None, -1) while too short to say."""
    chars: list[tuple[int, str]] = []
    for i, c in enumerate(text):
        if not c.isspace():
            chars.append((i, c))
            if len(chars) == max(map(len, skeletons)):
                break
    undecided = False
    for skeleton in skeletons:
        seen = "".join(c for _, c in chars[: len(skeleton)])
        if seen == skeleton:
            return True, chars[0][0]
        undecided |= skeleton.startswith(seen)
    return (None if undecided else False), -1


@dataclass
class _Scanner:
    """Where the JSON object or array that opens at `start` ends, fed the growing text."""

    start: int
    pos: int = -1
    depth: int = 0
    in_str: bool = False
    escaped: bool = False

    def end(self, text: str) -> int | None:
        """Index just past the value, or None while it is open (validity is json.loads's job)."""
        for i in range(max(self.pos, self.start), len(text)):
            c = text[i]
            if self.in_str:
                self.escaped, self.in_str = (False, True) if self.escaped else (c == "\\", c != '"')
            elif c == '"':
                self.in_str = True
            elif c in "[{":
                self.depth += 1
            elif c in "]}":
                self.depth -= 1
                if self.depth == 0:
                    return i + 1
        self.pos = len(text)
        return None


@dataclass
class JsonCallParser(CallParser):
    """The shared state machine; a format sets the class attributes and `decode`."""

    MARKER: ClassVar[str] = ""                       # text that opens a block ("" = none)
    ANYWHERE: ClassVar[bool] = False                 # the marker may open a block after content
    AFTER_MARKER: ClassVar[tuple[str, ...]] = ()     # how the JSON after the marker begins
    BARE: ClassVar[tuple[str, ...]] = ()             # how a block without the marker begins

    _fresh: bool = True                  # nothing but whitespace sent so far
    _scan: _Scanner | None = None        # inside a block: its JSON's scanner

    def decode(self, value: object) -> tuple[str, list[dict]] | None:
        """A block's JSON -> (content, calls), or None when it is not a call."""
        raise NotImplementedError

    def feed(self, text: str, final: bool = False) -> tuple[str, list[dict]]:
        self._buf += text
        out: list[str] = []
        new: list[dict] = []
        while self._buf and self._step(final, out, new):
            pass
        self.calls.extend(new)
        return "".join(out), new

    def _emit(self, out: list[str], n: int) -> None:
        """The first n characters held are content."""
        out.append(self._buf[:n])
        self._fresh = self._fresh and not self._buf[:n].strip()
        self._buf = self._buf[n:]

    def _step(self, final: bool, out: list[str], new: list[dict]) -> bool:
        """One decision; False when what is held must wait for more text (or all was sent)."""
        if self._done:
            self._emit(out, len(self._buf))
            return False
        if self._scan is not None:
            return self._block(final, out, new)
        if self._fresh:
            return self._at_start(final, out)
        if not self.ANYWHERE:
            self._done = True
            return True
        i = self._buf.find(self.MARKER)
        if i == 0:
            return self._after_marker(0, final, out)
        keep = 0 if final else partial_suffix(self._buf, self.MARKER)
        self._emit(out, i if i > 0 else len(self._buf) - keep)
        return i > 0

    def _at_start(self, final: bool, out: list[str]) -> bool:
        """Only whitespace so far: a block may open here, with the marker or bare."""
        body = self._buf.lstrip()
        lead = len(self._buf) - len(body)
        if not body:
            if final:
                self._emit(out, len(self._buf))
            return False
        if self.MARKER and body.startswith(self.MARKER):
            return self._after_marker(lead, final, out)
        maybe_marker = bool(self.MARKER) and self.MARKER.startswith(body)
        opens, first = _opens(body, self.BARE)
        if (maybe_marker or opens is None) and not final:
            return False
        if opens:
            self._scan = _Scanner(lead + first)
        else:
            self._fresh = False
        return True

    def _after_marker(self, at: int, final: bool, out: list[str]) -> bool:
        """The marker is at `at`: a block if JSON follows, else the marker is content."""
        after = at + len(self.MARKER)
        opens, first = _opens(self._buf[after:], self.AFTER_MARKER)
        if opens is None and not final:
            return False
        if opens:
            self._scan = _Scanner(after + first)
        else:
            self._emit(out, after)
            self._fresh = False
        return True

    def _block(self, final: bool, out: list[str], new: list[dict]) -> bool:
        """A block's JSON: a call (or generic's response) once it closes, else content."""
        end = self._scan.end(self._buf)
        if end is None and not final:
            return False
        got = None
        if end is not None:
            try:
                got = self.decode(json.loads(self._buf[self._scan.start:end]))
            except json.JSONDecodeError:
                pass
        end = len(self._buf) if end is None else end
        self._scan, self._fresh = None, False
        if got is None:
            self._emit(out, end)
            return True
        out.append(got[0])
        new.extend(got[1])
        self._buf = self._buf[end:]
        self._done = not (self.ANYWHERE and self.tools.parallel)
        return True


class Llama3Parser(JsonCallParser):
    """{"name": f, "parameters": {...}} as the whole answer, optionally after <|python_tag|>."""

    MARKER, AFTER_MARKER, BARE = PYTHON_TAG, ('{"',), ('{"',)

    def decode(self, value: object) -> tuple[str, list[dict]] | None:
        call = call_from(value, self.tools.names)
        return ("", [call]) if call else None


class MistralParser(JsonCallParser):
    """[TOOL_CALLS][{"name", "arguments", "id"}, ...] after content, or a bare array of calls
    opening the answer (a vocabulary's [TOOL_CALLS] control token is not in the text)."""

    MARKER, ANYWHERE, AFTER_MARKER, BARE = MISTRAL_MARKER, True, ("[", "{"), ('[{"',)

    def decode(self, value: object) -> tuple[str, list[dict]] | None:
        items = value if isinstance(value, list) else [value]
        calls = [call_from(o, self.tools.names, mistral_id(o.get("id")) if isinstance(o, dict) else None)
                 for o in items]
        return ("", calls) if calls and None not in calls else None


class GraniteParser(JsonCallParser):
    """Granite 3.x: <|tool_call|>[{"name", "arguments"}, ...] after content, or the bare array opening
    the answer (its marker is a control token, which the text does not show): Mistral's without ids."""

    MARKER, ANYWHERE, AFTER_MARKER, BARE = GRANITE_MARKER, True, ("[", "{"), ('[{"',)

    def decode(self, value: object) -> tuple[str, list[dict]] | None:
        calls = [call_from(o, self.tools.names) for o in (value if isinstance(value, list) else [value])]
        return ("", calls) if calls and None not in calls else None


class GenericParser(JsonCallParser):
    """{"tool_call": call}, {"tool_calls": [call, ...]} or {"response": text} (the content)."""

    BARE = ('{"',)

    def decode(self, value: object) -> tuple[str, list[dict]] | None:
        if not isinstance(value, dict):
            return None
        if "tool_call" in value or "tool_calls" in value:
            items = [value["tool_call"]] if "tool_call" in value else value["tool_calls"]
            calls = [call_from(o, self.tools.names) for o in items] if isinstance(items, list) else []
            return ("", calls) if calls and None not in calls else None
        if "response" in value:
            response = value["response"]
            return (response if isinstance(response, str) else json.dumps(response, ensure_ascii=False)), []
        return None


PARSERS: dict[str, type[CallParser]] = {
    HERMES: HermesParser, LLAMA3: Llama3Parser, MISTRAL: MistralParser, GENERIC: GenericParser,
    QWEN_XML: QwenXmlParser, SEED_XML: SeedXmlParser, GLM: GlmParser, LFM2: PythonicParser, GRANITE: GraniteParser}


def call_parser(tools: ToolConfig) -> CallParser:
    """A fresh parser for one answer, in the request's call format."""
    return PARSERS[tools.format](tools)
