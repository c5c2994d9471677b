"""One chat answer's text -> (reasoning, content, tool calls), whole or streamed: the chat formatters'
single entry (formats/openai.py, formats/anthropic.py).

Two shapes of answer:
- a `<think>` block, then text in which the tool-call format's calls are found: the reasoning
  splitter (reasoning.py) and then the format's call parser (tools/calls.py, calls_json.py), each
  fed what the other leaves;
- gpt-oss's harmony messages (harmony.py), whose headers say at once what is reasoning, content
  or a call: one parser for all three. A request that asks for another call format (e.g.
  `--tool-call-format hermes` on a gpt-oss template) gets that format's parser on harmony's
  content.
`parse(text)` is `feed(text, final=True)`, so a streamed answer adds up to the whole one's split.
"""

from __future__ import annotations

from dataclasses import dataclass

from slotserver.server.harmony import HarmonyParser
from slotserver.server.reasoning import ReasoningMode, ReasoningSplitter
from slotserver.server.tools.calls import CallParser
from slotserver.server.tools.calls_json import call_parser
from slotserver.server.tools.formats import HARMONY
from slotserver.server.tools.request import ToolConfig


@dataclass
class AnswerParser:
    """The answer's split: `first` takes the raw text (the <think> splitter, or the harmony parser),
    `calls` (a call format's parser, or None) what `first` gives as content."""

    first: ReasoningSplitter | HarmonyParser
    calls: CallParser | None = None

    @property
    def tool_calls(self) -> list[dict]:
        """Every call parsed so far."""
        own = self.first.calls if isinstance(self.first, HarmonyParser) else []
        return own + (self.calls.calls if self.calls is not None else [])

    def feed(self, text: str, final: bool = False) -> tuple[str, str, list[dict]]:
        """-> (reasoning, content, calls) decided by this piece of the answer."""
        if isinstance(self.first, HarmonyParser):
            reasoning, content, calls = self.first.feed(text, final)
        else:
            (reasoning, content), calls = self.first.feed(text, final), []
        if self.calls is not None:
            content, more = self.calls.feed(content, final)
            calls = calls + more
        return reasoning, content, calls

    def parse(self, text: str) -> tuple[str, str, list[dict]]:
        """A whole answer -> (reasoning, content, calls); content is stripped around calls, as
        every format's whole parse does."""
        reasoning, content, calls = self.feed(text, final=True)
        return reasoning, (content.strip() if calls else content), calls


def answer_parser(mode: ReasoningMode, tools: ToolConfig | None, stream: bool) -> AnswerParser:
    """A fresh parser for one answer: `mode` says how its reasoning is split (and whether it is
    harmony), `tools` (active tools, or None) how its calls are written."""
    own = tools is not None and tools.format == HARMONY
    if mode.harmony is not None or own:
        first = HarmonyParser(extract=mode.format != "none", tools=tools if own else None, prefix=mode.harmony or "")
        return AnswerParser(first, call_parser(tools) if tools is not None and not own else None)
    return AnswerParser(mode.splitter(stream), call_parser(tools) if tools is not None else None)
