"""The Responses API's response object and its output items, built from a chat answer.

The chat formatter (formats/openai.py) already splits an answer into reasoning, text and tool
calls; this turns its message into OpenAI's Responses shapes, as llama-server does
(tools/server/server-task.cpp `to_json_oaicompat_resp`):
- `output`: a `reasoning` item (its text as one `reasoning_text` content part; no summary) when
  the model reasoned, a `message` item with one `output_text` part when it wrote text, then one
  `function_call` item per call (`call_id` is the chat call's `call_...` id, the item's id
  `fc_...`). Empty text gives no message item.
- `status` "completed", or "incomplete" with `incomplete_details.reason` "max_output_tokens"
  when the token limit cut the answer (llama-server always says completed; OpenAI says this);
  the last item is then "incomplete" too.
- `usage`: input/output/total tokens, cached prompt tokens, and the reasoning's tokens (its text
  tokenized again: the engine does not tell reasoning tokens apart).
- the request's settings (`instructions`, `tools`, `tool_choice`, `text`, `temperature`, ...) are
  repeated, as OpenAI does; `output_text` is not a field (the SDKs compute it from `output`).
`timings` (llama-server's) rides along, as on the chat routes.
"""

from __future__ import annotations

import secrets
import time
from typing import Any

from slotserver.engine.request import FinalEvent
from slotserver.model.text.tokenizer import Tokenizer
from slotserver.server.formats.llama import timings
from slotserver.server.formats.openai import OpenAIFormatter
from slotserver.server.generation import Outcome

LIMIT_REASON = {"reason": "max_output_tokens"}


def new_id(prefix: str) -> str:
    return prefix + secrets.token_hex(12)


def reasoning_item(item_id: str, text: str, status: str = "completed") -> dict:
    return {"id": item_id, "type": "reasoning", "summary": [], "encrypted_content": None,
            "content": [{"type": "reasoning_text", "text": text}] if text else [], "status": status}


def text_part(text: str, logprobs: list | None = None) -> dict:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": logprobs or []}


def message_item(item_id: str, text: str | None, logprobs: list | None = None, status: str = "completed") -> dict:
    """A message item; `text` None: just opened, no content part yet."""
    content = [] if text is None else [text_part(text, logprobs)]
    return {"id": item_id, "type": "message", "role": "assistant", "status": status, "content": content}


def call_item(call: dict, status: str = "completed", arguments: str | None = None) -> dict:
    """A chat tool call -> a function_call item (`arguments` overrides: "" while streaming)."""
    fn = call["function"]
    suffix = call["id"][len("call_"):] if call["id"].startswith("call_") else call["id"]
    return {"id": "fc_" + suffix, "type": "function_call", "status": status, "call_id": call["id"],
            "name": fn["name"], "arguments": fn["arguments"] if arguments is None else arguments}


def incomplete(final: FinalEvent) -> bool:
    return final.stop_type == "limit"


class ResponsesFormatter:
    """Builds the response object of one answer (same id, created_at and settings throughout)."""

    def __init__(self, chat: OpenAIFormatter, echo: dict[str, Any], tokenizer: Tokenizer) -> None:
        params = chat.job.request.params
        self.chat, self.tokenizer = chat, tokenizer
        self.id = new_id("resp_")
        self.created = int(time.time())
        self.echo = {**echo, "temperature": params.temperature, "top_p": params.top_p}

    def response(self, status: str, output: list[dict], final: FinalEvent | None = None,
                 reasoning: str = "") -> dict:
        """The response object: "in_progress" (no output, no usage yet) or finished."""
        body = {"id": self.id, "object": "response", "created_at": self.created, "status": status,
                "completed_at": None, "error": None, "incomplete_details": None, "model": self.chat.model,
                "output": output, "usage": None, **self.echo}
        if final is not None:
            body["completed_at"] = int(time.time())
            body["incomplete_details"] = LIMIT_REASON if incomplete(final) else None
            body["usage"] = self.usage(final, reasoning)
        return body

    def finished(self, output: list[dict], final: FinalEvent, reasoning: str) -> dict:
        """The final response object; the last item shares an "incomplete" status."""
        status = "incomplete" if incomplete(final) else "completed"
        if status == "incomplete" and output:
            output[-1] = {**output[-1], "status": "incomplete"}
        return self.response(status, output, final, reasoning)

    def usage(self, final: FinalEvent, reasoning: str) -> dict:
        n_reasoning = len(self.tokenizer.encode(reasoning, add_special=False)) if reasoning else 0
        return {"input_tokens": final.n_prompt, "input_tokens_details": {"cached_tokens": final.n_cached},
                "output_tokens": final.n_predicted,
                "output_tokens_details": {"reasoning_tokens": min(n_reasoning, final.n_predicted)},
                "total_tokens": final.n_prompt + final.n_predicted}

    def full(self, out: Outcome) -> dict:
        """A whole answer -> the response object (llama-server's item order)."""
        choice = self.chat.full(out)["choices"][0]
        message, logprobs = choice["message"], choice["logprobs"]
        reasoning = message.get("reasoning_content") or ""
        output = []
        if reasoning:
            output.append(reasoning_item(new_id("rs_"), reasoning))
        if message.get("content"):
            content_lp = logprobs["content"] if logprobs else None
            output.append(message_item(new_id("msg_"), message["content"], content_lp))
        output.extend(call_item(c) for c in message.get("tool_calls") or [])
        body = self.finished(output, out.final, reasoning)
        body["timings"] = timings(out.final)
        return body
