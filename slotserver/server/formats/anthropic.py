"""Anthropic's Messages answers, whole and streamed, from what the chat machinery generated.

The answer's text is split as on /v1/chat/completions (answer.py): the `<think>` block first
(reasoning.py), then tool calls out of what remains (tools/calls.py, calls_json.py), or gpt-oss's
harmony messages (harmony.py). Each part becomes a content
block, in order: `thinking` (with an empty `signature`: a local model has nothing to sign, as
llama-server answers), `text`, then one `tool_use` per call (`toolu_` ids, `input` an object). An
answer with no block at all gets one empty text block, so `content[0]` is always there.
`stop_reason`: max_tokens at the token limit, else tool_use when the answer holds calls, else
stop_sequence (with `stop_sequence` set) at a stop string, else end_turn. `usage` counts as
llama-server's: input_tokens without the prompt tokens reused from the cache, which are
cache_read_input_tokens.

Streams are Anthropic's named SSE events: `message_start` (sent at once; its usage counts the
whole prompt, as nothing is known about the cache yet), then per block `content_block_start`,
its deltas (`thinking_delta`, `text_delta`, one `input_json_delta` holding a call's whole input)
and `content_block_stop`, one block open at a time with indices 0, 1, 2... as Anthropic streams
them (llama-server keeps every block open to the end; clients accept both), a `signature_delta`
before a thinking block closes, then `message_delta` (stop_reason, stop_sequence and the final
usage) and `message_stop`. No `[DONE]`.
"""

from __future__ import annotations

import json
import secrets

from slotserver.engine.request import FinalEvent
from slotserver.server.answer import answer_parser
from slotserver.server.anthropic.errors import error_body
from slotserver.server.generation import Outcome
from slotserver.server.jsonio import dumps
from slotserver.server.openai_params import OpenAIJob


def sse(name: str, data: dict) -> bytes:
    """One named event: `event: NAME` then `data: JSON`."""
    return b"event: " + name.encode() + b"\ndata: " + dumps(data) + b"\n\n"


def error_event(status: int, message: str) -> bytes:
    return sse("error", error_body(status, message))


def stop_reason(final: FinalEvent, calls: bool) -> str:
    if final.stop_type == "limit":
        return "max_tokens"
    if calls:
        return "tool_use"
    return "stop_sequence" if final.stop_type == "word" else "end_turn"


def stop_sequence(final: FinalEvent) -> str | None:
    """The stop string that ended the answer, whenever one did (llama-server names it with an eos
    end too: a stop string in the end token's --special text)."""
    return final.stopping_word or None


def usage(final: FinalEvent) -> dict:
    return {"input_tokens": final.n_prompt - final.n_cached, "cache_read_input_tokens": final.n_cached,
            "output_tokens": final.n_predicted}


def tool_use(call: dict, with_input: bool = True) -> dict:
    """An OpenAI call (calls.py) -> a tool_use block; `input` {} in a stream's block start."""
    block = {"type": "tool_use", "id": "toolu_" + call["id"].removeprefix("call_"), "name": call["function"]["name"]}
    block["input"] = json.loads(call["function"]["arguments"]) if with_input else {}
    return block


class AnthropicFormatter:
    """Every object of one answer (same id and model throughout); `stream_*` keep a stream's state."""

    def __init__(self, chat: OpenAIJob, omit_thinking: bool = False) -> None:
        self.chat, self.model, self.omit = chat, chat.model, omit_thinking
        self.id = "msg_" + secrets.token_hex(12)
        self.answer = answer_parser(chat.reasoning, chat.tools, stream=True)
        self.index, self.open = -1, None     # the streamed block now open (its index and type)

    def _thinking(self, text: str) -> dict:
        return {"type": "thinking", "thinking": "" if self.omit else text, "signature": ""}

    def full(self, out: Outcome) -> dict:
        reasoning, content, calls = answer_parser(self.chat.reasoning, self.chat.tools, stream=False).parse(out.text)
        blocks = [self._thinking(reasoning)] if reasoning else []
        blocks += [{"type": "text", "text": content}] if content else []
        blocks += [tool_use(c) for c in calls]
        return {"id": self.id, "type": "message", "role": "assistant", "model": self.model,
                "content": blocks or [{"type": "text", "text": ""}], "stop_reason": stop_reason(out.final, bool(calls)),
                "stop_sequence": stop_sequence(out.final), "usage": usage(out.final)}

    def stream_start(self) -> bytes:
        n_prompt = len(self.chat.job.request.prompt_ids)
        message = {"id": self.id, "type": "message", "role": "assistant", "model": self.model, "content": [],
                   "stop_reason": None, "stop_sequence": None,
                   "usage": {"input_tokens": n_prompt, "cache_read_input_tokens": 0, "output_tokens": 0}}
        return sse("message_start", {"type": "message_start", "message": message})

    def _begin(self, block: dict) -> list[bytes]:
        events = self._close()
        self.index, self.open = self.index + 1, block["type"]
        return events + [sse("content_block_start", {"type": "content_block_start", "index": self.index,
                                                     "content_block": block})]

    def _delta(self, delta: dict) -> bytes:
        return sse("content_block_delta", {"type": "content_block_delta", "index": self.index, "delta": delta})

    def _close(self) -> list[bytes]:
        if self.open is None:
            return []
        events = [self._delta({"type": "signature_delta", "signature": ""})] if self.open == "thinking" else []
        self.open = None
        return events + [sse("content_block_stop", {"type": "content_block_stop", "index": self.index})]

    def stream_text(self, text: str, final: bool = False) -> list[bytes]:
        """The events for newly generated text (a held-back partial tag sends nothing yet)."""
        reasoning, content, calls = self.answer.feed(text, final)
        events: list[bytes] = []
        if reasoning:
            if self.open != "thinking":
                events += self._begin(self._thinking(""))
            if not self.omit:
                events.append(self._delta({"type": "thinking_delta", "thinking": reasoning}))
        if content:
            if self.open != "text":
                events += self._begin({"type": "text", "text": ""})
            events.append(self._delta({"type": "text_delta", "text": content}))
        for call in calls:
            events += self._begin(tool_use(call, with_input=False))
            events.append(self._delta({"type": "input_json_delta", "partial_json": call["function"]["arguments"]}))
            events += self._close()
        return events

    def stream_end(self, final: FinalEvent) -> list[bytes]:
        """What is left of the text, the last block's close, message_delta and message_stop."""
        events = self.stream_text(final.text, final=True)
        if self.index < 0:
            events += self._begin({"type": "text", "text": ""})
        events += self._close()
        calls = bool(self.answer.tool_calls)
        delta = {"stop_reason": stop_reason(final, calls), "stop_sequence": stop_sequence(final)}
        events.append(sse("message_delta", {"type": "message_delta", "delta": delta, "usage": usage(final)}))
        return events + [sse("message_stop", {"type": "message_stop"})]
