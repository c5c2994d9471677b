"""gpt-oss's harmony chat format: the model's output -> reasoning, content and tool calls, whole or
streamed, as llama.cpp parses it (common/parsers/gpt-oss.cpp, its cases in tests/test-chat.cpp).

A harmony answer is a sequence of messages. The generation prompt ends with `<|start|>assistant`,
so the output opens with the first message's header; every later message starts with
`<|start|>assistant` again. A header names a channel and maybe a recipient and a content type:

    <|channel|>analysis<|message|>I'm thinking<|end|>            -> reasoning_content
    <|channel|>final<|message|>Hello!                            -> content
    <|channel|>commentary<|message|>Let me look.<|end|>          -> content (a preamble)
    <|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{"a": 1}
     to=functions.NAME<|channel|>commentary json<|message|>{"a": 1}   -> a call (recipient in the role)

What llama.cpp's parser does and this keeps:
- a recipient `functions.NAME` naming an offered function (tools active) makes the message's body
  the call's arguments (the JSON text as written, which must parse to an object); any other
  recipient (a builtin such as `container.exec` or `python`, or a function not offered) is an
  "unsolicited" call: its body is dropped, neither content nor call;
- gpt-oss-20b's stray `<|channel|>commentary` (optionally ` to=assistant`) before a header's real
  channel is skipped;
- reasoning blocks are concatenated as written (no strip); reasoning that is only whitespace is
  dropped; with reasoning_format `none` an analysis message stays in the content, its header and
  `<|end|>` included, while the headers of content messages never show;
- a message may end at the end of the output without its `<|end|>` (the model stopped on
  `<|return|>` or `<|call|>`, end-of-generation tokens whose text the answer does not carry).
Where llama.cpp fails the whole parse (output that is no harmony at all, a call whose arguments
are no JSON object), the text is given back as content instead: never dropped, as the other
formats here. Without parallel_tool_calls only the first call is a call (later ones are dropped
like unsolicited ones); gpt-oss itself stops after each call (`<|call|>` is end-of-generation).

Streaming: `feed` returns only what is decided; a header is held until its `<|message|>`, a body's
tail while it may still become `<|end|>`, a call until its body ends; `parse(text)` is
`feed(text, final=True)`, so streamed deltas add up to the whole answer's split.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

from slotserver.server.tools.calls import make_call, partial_suffix
from slotserver.server.tools.request import ToolConfig

START, CHANNEL, MESSAGE, END, CALL = "<|start|>assistant", "<|channel|>", "<|message|>", "<|end|>", "<|call|>"
HEADER = re.compile(
    r"\s*(?:to=(?P<role_to>[^\s<]+))?"                                      # recipient in the role header
    r"(?:<\|channel\|>commentary(?:\s*to=assistant)?(?=<\|channel\|>))?"   # gpt-oss-20b's stray commentary
    r"<\|channel\|>(?P<channel>[A-Za-z0-9_-]+)"
    r"(?:\s*to=(?P<chan_to>[^\s<]+))?"                                      # recipient in the channel header
    r"(?:\s*(?:<\|constrain\|>)?(?P<ctype>[A-Za-z0-9_-]+))?\s*")
REASONING, CONTENT, TOOL, DROP, RAW = "reasoning", "content", "call", "drop", "raw"
WS = " \t\n\r"   # what llama.cpp's mapper counts as whitespace-only reasoning


def template_is_harmony(source: str | None) -> bool:
    """llama.cpp's test for a GPT-OSS template: its source writes `<|channel|>`."""
    return CHANNEL in (source or "")


BUDGET_TAGS = (CHANNEL + "analysis" + MESSAGE, (END,))   # the reasoning budget's block (llama.cpp's thinking tags)


def in_analysis(prefix: str) -> bool:
    """Whether an answer that continues `prefix` (answer_prefix) starts inside an analysis message."""
    i = prefix.rfind(BUDGET_TAGS[0])
    return i >= 0 and END not in prefix[i:]


def answer_prefix(prompt: str) -> str:
    """What of the prompt the answer continues: the text after its last `<|start|>` when that
    opens an assistant message ('' for the generation prompt `<|start|>assistant`; a header and
    body when a continued assistant message ends the prompt), else ''. The parser reads it first,
    so the answer is read inside that message (llama.cpp parses generation prompt + output)."""
    i = prompt.rfind("<|start|>")
    return prompt[i + len(START):] if i >= 0 and prompt.startswith(START, i) else ""


@dataclass
class HarmonyParser:
    """One answer's harmony messages -> (reasoning, content, calls); see the module docstring.
    `extract` False (reasoning_format none) leaves analysis messages in the content; `tools`
    (active tools in the harmony call format) makes `functions.NAME` messages calls."""

    extract: bool = True
    tools: ToolConfig | None = None
    prefix: str = ""
    calls: list[dict] = field(default_factory=list)
    _state: str = "header"     # "header" (until <|message|>), "body", "between" (after <|end|>)
    _kind: str = CONTENT       # the body's message kind
    _name: str = ""            # a call's function
    _buf: str = ""
    _reason_ws: str = ""       # whitespace-only reasoning so far, held (dropped if nothing follows)
    _reasoned: bool = False

    def __post_init__(self) -> None:
        if self.prefix:   # the continued message's header (and body) set the state; their text is not answer
            self.feed(self.prefix)

    def parse(self, text: str) -> tuple[str, str, list[dict]]:
        """A whole answer -> (reasoning, content, calls)."""
        return self.feed(text, final=True)

    def feed(self, text: str, final: bool = False) -> tuple[str, str, list[dict]]:
        """-> (reasoning, content, calls) decided by this piece; `final` ends the answer."""
        self._buf += text
        out: dict[str, list] = {REASONING: [], CONTENT: []}
        n_calls = len(self.calls)
        while self._step(final, out):
            pass
        return self._reasoning("".join(out[REASONING]), final), "".join(out[CONTENT]), self.calls[n_calls:]

    def _step(self, final: bool, out: dict[str, list]) -> bool:
        """One move of the state machine; False when it needs more text (or the text is done)."""
        if self._state == "between":
            return self._between(final, out)
        if self._state == "header":
            return self._header(final, out)
        return self._body(final, out)

    def _between(self, final: bool, out: dict[str, list]) -> bool:
        """After a message's <|end|>: the next one's `<|start|>assistant`, or stray text (content)."""
        rest = self._buf.lstrip(WS)
        if rest.startswith(START):
            self._buf, self._state = rest[len(START):], "header"
            return True
        if START.startswith(rest) and not final:
            return False
        if rest:
            self._state, self._kind = "body", RAW
            return True
        self._buf = ""
        return False

    def _header(self, final: bool, out: dict[str, list]) -> bool:
        """Hold the header until its <|message|>; then pick the body's kind."""
        i = self._buf.find(MESSAGE)
        if i < 0:
            could_be = any(m.startswith(self._buf.lstrip(WS)[:len(m)]) for m in (CHANNEL, "to="))
            if final or not could_be:   # no harmony header: the rest is plain content (never dropped)
                self._state, self._kind = "body", RAW
                return bool(self._buf)
            return False
        head, self._buf = self._buf[:i], self._buf[i + len(MESSAGE):]
        m = HEADER.fullmatch(head)
        if m is None:
            self._buf, self._state, self._kind = head + MESSAGE + self._buf, "body", RAW
            return True
        self._state, self._kind = "body", self._kind_of(m.group("role_to") or m.group("chan_to"), m.group("channel"))
        if self._kind == REASONING and not self.extract:
            out[CONTENT].append(head + MESSAGE)
        return True

    def _kind_of(self, recipient: str | None, channel: str) -> str:
        if recipient is None or recipient == "assistant":
            return REASONING if channel == "analysis" else CONTENT
        name = recipient.removeprefix("functions.")
        offered = self.tools is not None and self.tools.active \
            and name in (t["function"]["name"] for t in self.tools.allowed)
        if recipient.startswith("functions.") and offered and (self.tools.parallel or not self.calls):
            self._name = name
            return TOOL
        return DROP

    def _body(self, final: bool, out: dict[str, list]) -> bool:
        """A message's body up to its end marker (<|end|>, or <|call|> after a call)."""
        if self._kind == RAW:
            out[CONTENT].append(self._buf)
            self._buf = ""
            return False
        ends = (END, CALL) if self._kind in (TOOL, DROP) else (END,)
        hits = [(j, e) for e in ends if (j := self._buf.find(e)) >= 0]
        if hits:
            j, marker = min(hits)
            body, self._buf = self._buf[:j], self._buf[j + len(marker):]
            self._emit(body, out, done=True, marker=marker)
            self._state = "between"
            return True
        if final:
            body, self._buf = self._buf, ""
            self._emit(body, out, done=True)
            return False
        if self._kind in (REASONING, CONTENT):
            keep = partial_suffix(self._buf, END)
            body, self._buf = self._buf[:len(self._buf) - keep], self._buf[len(self._buf) - keep:]
            self._emit(body, out, done=False)
        return False

    def _emit(self, body: str, out: dict[str, list], done: bool, marker: str = "") -> None:
        """A decided piece of the body (`done`: its last, `marker` the end marker that closed it)."""
        if self._kind == REASONING:
            if self.extract:
                out[REASONING].append(body)
            else:   # reasoning_format none: the analysis message as written
                out[CONTENT].append(body + marker)
        elif self._kind == CONTENT:
            out[CONTENT].append(body)
        elif self._kind == TOOL and done:
            call = _call(self._name, body)
            if call is None:   # arguments that are no JSON object: given back as content
                out[CONTENT].append(body)
            else:
                self.calls.append(call)

    def _reasoning(self, text: str, final: bool) -> str:
        """Whitespace-only reasoning is held until something else follows, dropped at the end."""
        if self._reasoned or not text:
            return text
        text = self._reason_ws + text
        if text.strip(WS):
            self._reasoned, self._reason_ws = True, ""
            return text
        self._reason_ws = "" if final else text
        return ""


def _call(name: str, body: str) -> dict | None:
    """A call's body (its arguments as the model wrote them) -> an OpenAI call, or None."""
    text = body.strip()
    try:
        args = json.loads(text)
    except json.JSONDecodeError:
        return None
    if not isinstance(args, dict):
        return None
    call = make_call(name, args)
    call["function"]["arguments"] = text   # as written, as llama.cpp returns it
    return call
