"""OpenAI's response objects for /v1/completions and /v1/chat/completions, whole and streamed.

Shapes follow OpenAI's API reference (what the official client parses): `cmpl-`/`chatcmpl-` ids,
`object`, `created`, `model`, `choices[0]` with `text` / `message` / `delta`, `finish_reason`
"stop" or "length", `usage`. Streams put `usage` in the chunk that carries the finish_reason (as
llama-server does) and, when `stream_options.include_usage` is set, also send OpenAI's separate
final chunk with empty `choices`. Log-probabilities use the chat format for chat and the legacy
`tokens`/`token_logprobs`/`top_logprobs`/`text_offset` format for completions; as llama-server's,
they list the end-of-generation token too (its text '': it adds none to the answer), streamed or
not.
Chat answers of reasoning models carry their `<think>` block (or gpt-oss's analysis messages) as
`reasoning_content` (message or delta); tool calls are parsed from what remains (answer.py).
"""

from __future__ import annotations

import secrets
import time

from slotserver import __version__
from slotserver.engine.request import FinalEvent, ProgressEvent, TokenEvent
from slotserver.server.formats.llama import timings
from slotserver.server.generation import Outcome
from slotserver.server.sse import event as sse_event
from slotserver.server.sse_template import SSETemplate, hole, json_str
from slotserver.server.params import CompletionJob
from slotserver.server.reasoning import ReasoningMode
from slotserver.server.answer import answer_parser
from slotserver.server.tools.calls import stream_deltas
from slotserver.server.tools.request import ToolConfig
from slotserver.model.text.tokenizer import Tokenizer

FINGERPRINT = f"slotserver-{__version__}"


def finish_reason(final: FinalEvent, calls: bool = False) -> str:
    """llama-server's: "length" at a limit, else "tool_calls" when the answer holds calls, else "stop"."""
    if final.stop_type == "limit":
        return "length"
    return "tool_calls" if calls else "stop"


def usage(final: FinalEvent) -> dict:
    return {"prompt_tokens": final.n_prompt, "completion_tokens": final.n_predicted,
            "total_tokens": final.n_prompt + final.n_predicted}


def _piece(tokenizer: Tokenizer, token: int, special: bool) -> tuple[str, list[int]]:
    """A token's text as the answer has it (llama-server's token_to_piece): a control token's ('' for
    <|im_end|>) only with `special` (--special)."""
    raw = tokenizer.token_bytes(token, special=special)
    return raw.decode("utf-8", "replace"), list(raw)


def chat_logprobs(tokenizer: Tokenizer, events: list[TokenEvent], n_top: int, special: bool = False) -> dict:
    content = []
    for ev in events:
        text, raw = _piece(tokenizer, ev.token, special)
        tops = [dict(zip(("token", "bytes"), _piece(tokenizer, t, special)), logprob=lp) for t, lp in ev.top[:n_top]]
        content.append({"token": text, "logprob": ev.logprob, "bytes": raw, "top_logprobs": tops})
    return {"content": content}


def legacy_logprobs(tokenizer: Tokenizer, events: list[TokenEvent], n_top: int, offset: int = 0,
                    special: bool = False) -> dict:
    tokens, lps, tops, offsets = [], [], [], []
    for ev in events:
        text, _ = _piece(tokenizer, ev.token, special)
        tokens.append(text)
        lps.append(ev.logprob)
        tops.append({_piece(tokenizer, t, special)[0]: lp for t, lp in ev.top[:n_top]})
        offsets.append(offset)
        offset += len(text)
    return {"tokens": tokens, "token_logprobs": lps, "top_logprobs": tops, "text_offset": offsets}


class OpenAIFormatter:
    """Builds every object of one answer (same id, created and model throughout)."""

    def __init__(self, job: CompletionJob, model: str, tokenizer: Tokenizer, chat: bool,
                 tools: ToolConfig | None = None, reasoning: ReasoningMode | None = None) -> None:
        self.job, self.model, self.tokenizer, self.chat = job, model, tokenizer, chat
        self.id = ("chatcmpl-" if chat else "cmpl-") + secrets.token_hex(12)
        self.created = int(time.time())
        self.offset = 0  # legacy logprobs: characters streamed so far
        self.tools = tools if chat else None
        self.index, self._tool_config = job.index, tools
        self.reasoning = reasoning if chat and reasoning is not None else ReasoningMode()
        self.answer = answer_parser(self.reasoning, self.tools, stream=True)   # the streamed answer's split
        self._delta_template: SSETemplate | None | bool = False   # made at the first plain delta

    def sibling(self, job: CompletionJob) -> "OpenAIFormatter":
        """The formatter of another choice of the same answer (same id and created)."""
        other = OpenAIFormatter(job, self.model, self.tokenizer, self.chat, self._tool_config, self.reasoning)
        other.id, other.created = self.id, self.created
        return other

    def _envelope(self, choices: list[dict], chunk: bool) -> dict:
        kind = "text_completion"
        if self.chat:
            kind = "chat.completion.chunk" if chunk else "chat.completion"
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model,
                "system_fingerprint": FINGERPRINT, "choices": choices}

    def _logprobs(self, events: list[TokenEvent]) -> dict | None:
        if not self.job.want_logprobs:
            return None
        if self.chat:
            return chat_logprobs(self.tokenizer, events, self.job.n_probs, self.job.request.special)
        lp = legacy_logprobs(self.tokenizer, events, self.job.n_probs, self.offset, self.job.request.special)
        self.offset = lp["text_offset"][-1] + len(lp["tokens"][-1]) if events else self.offset
        return lp

    def full(self, out: Outcome) -> dict:
        reasoning, content, calls = answer_parser(self.reasoning, self.tools, stream=False).parse(out.text)
        choice = {"index": self.index, "logprobs": self._logprobs(out.tokens),
                  "finish_reason": finish_reason(out.final, bool(calls))}
        if self.chat:
            choice["message"] = {"role": "assistant", "content": content or (None if calls else "")}
            if reasoning:   # only when there is some, as llama-server
                choice["message"]["reasoning_content"] = reasoning
            if calls:
                choice["message"]["tool_calls"] = calls
        else:
            choice["text"] = out.text
        body = self._envelope([choice], chunk=False)
        body.update(usage=usage(out.final), timings=timings(out.final))
        return body

    def role_chunk(self) -> dict:
        """Chat streams open with the assistant role, as OpenAI's do."""
        delta = {"role": "assistant", "content": None}
        return self._envelope([{"index": self.index, "delta": delta, "logprobs": None, "finish_reason": None}], True)

    def delta_chunk(self, text: str, events: list[TokenEvent], reasoning: str = "") -> dict:
        choice = {"index": self.index, "logprobs": self._logprobs(events), "finish_reason": None}
        delta = {"reasoning_content": reasoning} if reasoning else {}
        if text or not reasoning:
            delta["content"] = text
        choice.update({"delta": delta} if self.chat else {"text": text})
        body = self._envelope([choice], chunk=True)
        if events and events[-1].timings is not None:   # timings_per_token
            body["timings"] = timings(events[-1].timings)
        return body

    def progress_chunk(self, ev: ProgressEvent) -> dict:
        """return_progress: no choices yet, the prompt's progress and timings (llama-server)."""
        body = self._envelope([], chunk=True)
        body["prompt_progress"] = {"total": ev.total, "cache": ev.cache, "processed": ev.processed,
                                   "time_ms": ev.time_ms}
        body["timings"] = timings(ev.timings)
        return body

    def stream_pieces(self, text: str, events: list[TokenEvent], final: bool = False) -> list[dict]:
        """The chunks for newly generated text: reasoning (inside `<think>`) as reasoning_content
        deltas, then with tools, content outside calls as content deltas and each completed call
        as OpenAI's tool_calls deltas; without, one content delta. Held-back text (a partial tag)
        sends nothing but the tokens' logprobs, if asked."""
        return self._pieces(text, events, final, self.delta_chunk)

    def stream_events(self, text: str, events: list[TokenEvent], final: bool = False) -> list[bytes]:
        """`stream_pieces` as SSE events, the same bytes; a plain content delta (no reasoning,
        logprobs or timings: nearly every chunk) is filled into a template (sse_template.py)."""
        return [c if isinstance(c, bytes) else sse_event(c) for c in self._pieces(text, events, final, self._delta_event)]

    def _pieces(self, text: str, events: list[TokenEvent], final: bool, delta) -> list:
        first = len(self.answer.tool_calls)
        reasoning, content, calls = self.answer.feed(text, final)
        keep = content or reasoning or (events and self.job.want_logprobs)
        chunks = [delta(content, events, reasoning)] if keep else []
        for i, call in enumerate(calls):
            for d in stream_deltas(first + i, call):
                choice = {"index": self.index, "logprobs": None, "finish_reason": None, "delta": {"tool_calls": [d]}}
                chunks.append(self._envelope([choice], chunk=True))
        return chunks

    def _delta_event(self, text: str, events: list[TokenEvent], reasoning: str = "") -> dict | bytes:
        """delta_chunk's chunk, as SSE bytes from the template where it has no variable part but text."""
        if reasoning or self.job.want_logprobs or (events and events[-1].timings is not None):
            return self.delta_chunk(text, events, reasoning)
        if self._delta_template is False:   # delta_chunk's own chunk for a plain text, the text a hole
            self._delta_template = SSETemplate.make(self.delta_chunk(hole(0), []), 1)
        if self._delta_template is None:
            return self.delta_chunk(text, events, reasoning)
        return self._delta_template.fill(json_str(text))

    def last_chunk(self, final: FinalEvent) -> dict:
        calls = bool(self.answer.tool_calls)
        choice = {"index": self.index, "logprobs": None, "finish_reason": finish_reason(final, calls)}
        choice.update({"delta": {}} if self.chat else {"text": ""})
        body = self._envelope([choice], chunk=True)
        body.update(usage=usage(final), timings=timings(final))
        return body

    def usage_chunk(self, finals: list[FinalEvent]) -> dict:
        """OpenAI's last chunk with `stream_options.include_usage`: empty choices, the whole usage."""
        body = self._envelope([], chunk=True)
        prompt = sum(f.n_prompt for f in finals)
        completion = sum(f.n_predicted for f in finals)
        body["usage"] = {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
        body["timings"] = timings(finals[0])   # llama-server's last chunk carries the (first choice's) timings
        return body
