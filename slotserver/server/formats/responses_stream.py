"""The Responses API's streamed events, made from the chat formatter's streamed pieces.

Framing: each event is `event: <type>` then `data: <json>` and a blank line (llama-server's
`format_oai_resp_sse`); no `[DONE]` at the end. Every event carries `type` and a
`sequence_number` counting from 0, as OpenAI's do.

Order (llama-server's, with OpenAI's closing events it leaves out):
  response.created, response.in_progress            at once (llama-server: with the first token)
  response.in_progress + prompt_progress, timings   per prompt batch, with `return_progress`
  per output item, one open at a time, each closed when the next kind starts or at the end:
    reasoning:  output_item.added, content_part.added (reasoning_text), reasoning_text.delta...,
                reasoning_text.done, content_part.done, output_item.done
    message:    output_item.added, content_part.added (output_text), output_text.delta...,
                output_text.done, content_part.done, output_item.done
    each call:  output_item.added (arguments ""), function_call_arguments.delta,
                function_call_arguments.done, output_item.done
  response.completed, with the whole response and llama-server's `timings`
A cut answer still ends with response.completed (as llama-server, and what llama.cpp's tests and
simple clients wait for); its response says status "incomplete" with incomplete_details.
Text that is only whitespace before anything else is held back, and dropped before a call (the
whole answer strips it: formats/openai.py), so a streamed answer has the items the whole one has.
With `timings_per_token`, a token's events end with one carrying `timings`;
`stream_options.include_obfuscation` pads every delta event with an `obfuscation` string.
"""

from __future__ import annotations

import secrets
from typing import Any

from slotserver.engine.request import FinalEvent, ProgressEvent, TokenEvent
from slotserver.server.formats.llama import timings
from slotserver.server.formats.responses import (ResponsesFormatter, call_item, message_item, new_id,
                                                 reasoning_item, text_part)
from slotserver.server.jsonio import dumps

REASONING, MESSAGE, CALL = "reasoning", "message", "function_call"


def frame(event: dict) -> bytes:
    """One SSE event named by its type."""
    return b"event: " + event["type"].encode() + b"\ndata: " + dumps(event) + b"\n\n"


class ResponseStream:
    """The events of one streamed answer; feed it the engine's events in order."""

    def __init__(self, fmt: ResponsesFormatter, obfuscate: bool = False) -> None:
        self.fmt, self.obfuscate = fmt, obfuscate
        self.seq = 0
        self.output: list[dict] = []        # finished items
        self.open: dict[str, Any] | None = None   # the open item: kind, id, text, logprobs, call
        self.held = ""                      # leading whitespace not yet sent
        self.pending_lp: list[dict] = []    # logprobs of tokens whose text is held back
        self.reasoning = ""                 # all the reasoning, for usage

    def _event(self, kind: str, **fields: Any) -> dict:
        event = {"type": kind, "sequence_number": self.seq, **fields}
        self.seq += 1
        if self.obfuscate and kind.endswith(".delta"):
            event["obfuscation"] = secrets.token_urlsafe(12)[: 1 + secrets.randbelow(16)]
        return event

    def _where(self) -> dict:
        return {"item_id": self.open["id"], "output_index": len(self.output)}

    def start(self) -> list[dict]:
        shell = self.fmt.response("in_progress", [])
        return [self._event("response.created", response=shell), self._event("response.in_progress", response=shell)]

    def progress(self, ev: ProgressEvent) -> list[dict]:
        event = self._event("response.in_progress", response=self.fmt.response("in_progress", []))
        event["prompt_progress"] = {"total": ev.total, "cache": ev.cache, "processed": ev.processed,
                                    "time_ms": ev.time_ms}
        event["timings"] = timings(ev.timings)
        return [event]

    def tokens(self, text: str, events: list[TokenEvent], final: bool = False) -> list[dict]:
        """The events for newly generated text (through the chat formatter's reasoning and tool
        call split); the last one carries the tokens' timings, if asked."""
        out: list[dict] = []
        for chunk in self.fmt.chat.stream_pieces(text, events, final):
            choice = chunk["choices"][0]
            delta = choice["delta"]
            lp = (choice.get("logprobs") or {}).get("content") or []
            n = len(out)
            if delta.get("reasoning_content"):
                out += self._reasoning(delta["reasoning_content"])
            self.pending_lp += lp
            if delta.get("content"):
                out += self._text(delta["content"])
            for call in delta.get("tool_calls") or []:
                out += self._call(call)
            if "timings" in chunk and len(out) > n:
                out[-1]["timings"] = chunk["timings"]
        return out

    def _switch(self, kind: str) -> list[dict]:
        """Close the open item unless it is of `kind` (calls always get a new item)."""
        if self.open is not None and (self.open["kind"] != kind or kind == CALL):
            return self._close()
        return []

    def _reasoning(self, text: str) -> list[dict]:
        out = self._switch(REASONING)
        if self.open is None:
            self.open = {"kind": REASONING, "id": new_id("rs_"), "text": ""}
            item = reasoning_item(self.open["id"], "", "in_progress")
            out.append(self._event("response.output_item.added", output_index=len(self.output), item=item))
            out.append(self._event("response.content_part.added", **self._where(), content_index=0,
                                   part={"type": "reasoning_text", "text": ""}))
        self.open["text"] += text
        self.reasoning += text
        out.append(self._event("response.reasoning_text.delta", **self._where(), content_index=0, delta=text))
        return out

    def _text(self, text: str) -> list[dict]:
        if self.open is None or self.open["kind"] != MESSAGE:
            if not (self.held + text).strip():
                self.held += text
                return []
            text, self.held = self.held + text, ""
        return self._text_delta(text)

    def _text_delta(self, text: str) -> list[dict]:
        """Open a message item (closing another) if none is, then send `text` into it."""
        out = self._switch(MESSAGE)
        if self.open is None:
            self.open = {"kind": MESSAGE, "id": new_id("msg_"), "text": "", "logprobs": []}
            item = message_item(self.open["id"], None, status="in_progress")
            out.append(self._event("response.output_item.added", output_index=len(self.output), item=item))
            out.append(self._event("response.content_part.added", **self._where(), content_index=0,
                                   part=text_part("")))
        lp, self.pending_lp = self.pending_lp, []
        self.open["text"] += text
        self.open["logprobs"] += lp
        out.append(self._event("response.output_text.delta", **self._where(), content_index=0, delta=text,
                               logprobs=lp))
        return out

    def _call(self, delta: dict) -> list[dict]:
        """A chat tool_calls delta: the header opens a function_call item, the arguments follow."""
        if "id" in delta:
            self.held = ""
            out = self._switch(CALL)
            call = {"id": delta["id"], "function": {"name": delta["function"]["name"], "arguments": ""}}
            self.open = {"kind": CALL, "id": call_item(call)["id"], "call": call}
            item = call_item(call, "in_progress")
            return out + [self._event("response.output_item.added", output_index=len(self.output), item=item)]
        args = delta["function"]["arguments"]
        self.open["call"]["function"]["arguments"] += args
        return [self._event("response.function_call_arguments.delta", **self._where(), delta=args)]

    def _close(self, status: str = "completed") -> list[dict]:
        item, where, out = self.open, self._where(), []
        if item["kind"] == REASONING:
            done = reasoning_item(item["id"], item["text"], status)
            out.append(self._event("response.reasoning_text.done", **where, content_index=0, text=item["text"]))
            out.append(self._event("response.content_part.done", **where, content_index=0, part=done["content"][0]))
        elif item["kind"] == MESSAGE:
            done = message_item(item["id"], item["text"], item["logprobs"], status)
            out.append(self._event("response.output_text.done", **where, content_index=0, text=item["text"],
                                   logprobs=item["logprobs"]))
            out.append(self._event("response.content_part.done", **where, content_index=0, part=done["content"][0]))
        else:
            done = call_item(item["call"], status)
            out.append(self._event("response.function_call_arguments.done", **where, name=done["name"],
                                   arguments=done["arguments"]))
        out.append(self._event("response.output_item.done", output_index=where["output_index"], item=done))
        self.output.append(done)
        self.open = None
        return out

    def finish(self, final: FinalEvent) -> list[dict]:
        """The end: whitespace-only text becomes a message unless a call came, the open item
        closes, then response.completed (see the module doc)."""
        cut = final.stop_type == "limit"
        out = self._text_delta(self.held) if self.held and not self._called() else []
        self.held = ""
        if self.open is not None:
            out += self._close("incomplete" if cut else "completed")
        body = self.fmt.finished(list(self.output), final, self.reasoning)
        event = self._event("response.completed", response=body)
        event["timings"] = timings(final)
        return out + [event]

    def _called(self) -> bool:
        return any(i["type"] == CALL for i in self.output) or (self.open or {}).get("kind") == CALL

    def error(self, message: str) -> list[dict]:
        """OpenAI's `error` event (with llama-server's `error` object, which the SDK raises)."""
        return [self._event("error", code="server_error", message=message, param=None,
                            error={"code": 500, "message": message, "type": "server_error"})]
