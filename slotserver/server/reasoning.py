"""Reasoning models' `<think>...</think>` block -> `reasoning_content`, whole or streamed.

Qwen 3, QwQ and the DeepSeek-R1 distills think aloud before they answer. llama-server returns that
text apart, in `message.reasoning_content` (and `delta.reasoning_content` when streaming), so chat
clients can fold it away and tool-call parsing never sees it. We follow its rules (common/chat.cpp
`try_parse_reasoning`, common/common.h `common_reasoning_format`):

- The block is recognised only where the answer starts (after optional whitespace), or from the
  first character when the prompt already opened it (`thinking_forced_open`: Qwen 3 and R1
  templates end their generation prompt with `<think>\\n`). A `<think>` later in the answer is text.
- The reasoning is stripped of surrounding whitespace; whitespace right after `</think>` is
  dropped. A block that never closes (the model stopped, or ran out of tokens, while thinking) is
  all reasoning.
- `reasoning_format`: `none` leaves the text alone; `deepseek` and `auto` (llama-server's default)
  split it; `deepseek-legacy` splits a whole answer the same way but, streamed, keeps the block
  inline in `content`, tags included (llama.cpp's `reasoning_in_content`).

Streaming is the hard part: a delta may end with `<thi` or `</thin`. `ReasoningSplitter.feed`
returns only what is decided and holds back a suffix that may still become a tag (and trailing
whitespace inside the reasoning, which is stripped if the block closes after it), so the deltas
always add up to exactly what the whole text gives (tests/test_server_reasoning.py checks any
split of a text against the whole).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

OPEN, CLOSE = "<think>", "</think>"
FORMATS = ("none", "auto", "deepseek", "deepseek-legacy")
WS = " \t\n\r\f\v"                          # C's isspace, what llama.cpp's string_strip strips
FORCED_OPEN = re.compile(r"<think>\s*$")    # llama.cpp's test for a generation prompt that opened it
START, THINK, CONTENT = "start", "think", "content"


def _held(text: str, tag: str) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of `tag` (may become it)."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0


def template_thinks(source: str | None) -> bool:
    """Whether a chat template (its source) has a reasoning block: it writes `<think>`."""
    return OPEN in (source or "")


def answer_start(prompt: str, continued: str | None = None) -> str:
    """Where the answer begins: THINK when the prompt left a `<think>` open (so the output starts
    inside the reasoning), CONTENT when a continued assistant message is already past its block,
    else START (the answer may open a block itself).

    `continued` is the final assistant message's text when the request continues it (prefill):
    the prompt then ends inside that message, so it is what decides, not the generation prompt."""
    if continued is None:
        return THINK if FORCED_OPEN.search(prompt) else START
    if continued.rfind(OPEN) > continued.rfind(CLOSE):
        return THINK
    return CONTENT if continued.strip(WS) else START


@dataclass
class ReasoningSplitter:
    """Splits one answer's text into (reasoning, content), fed piece by piece or whole.

    `extract` False (reasoning_format none) passes everything through as content. `inline`
    (deepseek-legacy, streamed) puts the stripped reasoning back into the content between its
    tags, as llama.cpp does, and then returns no reasoning at all."""

    extract: bool = True
    start: str = START
    inline: bool = False
    # markers that end the block and open the content, kept there (llama.cpp's thinking_end_tags
    # beside </think>: Qwen3.5's `<tool_call>`, a call made without closing the thought first)
    ends: tuple[str, ...] = ()
    _state: str = START
    _buf: str = ""
    _ws: str = ""               # whitespace inside the reasoning, held until more reasoning follows
    _seen: bool = False         # some reasoning text was returned (leading whitespace is dropped)
    _skip_ws: bool = False      # just after </think>: whitespace is dropped
    _opened: bool = False       # inline: "<think>" was put in the content

    def __post_init__(self) -> None:
        self._state = self.start if self.extract else CONTENT

    def feed(self, text: str, final: bool = False) -> tuple[str, str]:
        """-> (reasoning, content) decided by this piece; `final` flushes whatever is held."""
        self._buf += text
        reasoning, content, closed = [], [], False
        while True:
            if self._state == START and not self._begin(final):
                break
            if self._state == THINK:
                piece, closed = self._think(final)
                reasoning.append(piece)
                if self._state == THINK:
                    break
            if self._state == CONTENT:
                content.append(self._content())
                break
        return self._shape("".join(reasoning), "".join(content), closed or final)

    def parse(self, text: str) -> tuple[str, str]:
        """A whole answer -> (reasoning, content)."""
        return self.feed(text, final=True)

    def _begin(self, final: bool) -> bool:
        """At the answer's start: enter the block, decide it is content, or wait (False) while the
        text so far is whitespace and part of `<think>`."""
        rest = self._buf.lstrip(WS)
        if rest.startswith(OPEN):
            self._buf, self._state = rest[len(OPEN):], THINK
        elif OPEN.startswith(rest) and not final:
            return False
        else:
            self._state = CONTENT
        return True

    def _think(self, final: bool) -> tuple[str, bool]:
        """Inside the block: -> (reasoning decided now, whether the block closed). `</think>` is
        dropped with the whitespace after it; an `ends` marker stays, the content's start."""
        found = [(i, tag) for tag in (CLOSE, *self.ends) if (i := self._buf.find(tag)) >= 0]
        if found:
            i, tag = min(found)
            piece, self._buf = self._buf[:i], self._buf[i + (len(CLOSE) if tag == CLOSE else 0):]
            self._state, self._skip_ws = CONTENT, tag == CLOSE
            return self._reason(piece, end=True), True
        keep = 0 if final else max(_held(self._buf, tag) for tag in (CLOSE, *self.ends))
        piece, self._buf = self._buf[:len(self._buf) - keep], self._buf[len(self._buf) - keep:]
        return self._reason(piece, end=final), False

    def _reason(self, piece: str, end: bool) -> str:
        """Reasoning text with llama.cpp's strip applied across pieces: leading whitespace is
        dropped, trailing whitespace held back until non-space follows (dropped at the end)."""
        text = self._ws + piece
        if not self._seen:
            text = text.lstrip(WS)
        body = text.rstrip(WS)
        self._ws = "" if end else text[len(body):]
        self._seen = self._seen or bool(body)
        return body

    def _content(self) -> str:
        text, self._buf = self._buf, ""
        if self._skip_ws:
            text = text.lstrip(WS)
            self._skip_ws = not text
        return text

    def _shape(self, reasoning: str, content: str, closing: bool) -> tuple[str, str]:
        """deepseek-legacy streamed: the reasoning goes back into the content, between its tags
        (only a non-empty block gets them, as in llama.cpp)."""
        if not self.inline:
            return reasoning, content
        head = tail = ""
        if reasoning and not self._opened:
            head, self._opened = OPEN, True
        if self._opened and closing:
            tail, self._opened = CLOSE, False
        return "", head + reasoning + tail + content


@dataclass(frozen=True)
class ReasoningMode:
    """How one chat answer's text is split: the request's format and where the answer starts."""

    format: str = "none"
    start: str = START
    harmony: str | None = None   # a harmony (gpt-oss) answer: the prompt text it continues (answer.py)
    ends: tuple[str, ...] = ()   # ReasoningSplitter.ends: the tool-call opener where a format's parser says

    def splitter(self, stream: bool) -> ReasoningSplitter:
        inline = stream and self.format == "deepseek-legacy"
        return ReasoningSplitter(extract=self.format != "none", start=self.start, inline=inline, ends=self.ends)
