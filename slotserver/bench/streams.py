"""The two wire formats a benchmark speaks: request bodies and the meaning of each stream event.

`openai` (POST /v1/completions): events are `data: {completion chunk}`; a chunk carries a token
when `choices[0].text` is non-empty; `usage` (in the finish chunk as llama-server and slotserver
send it, or in the separate chunk `stream_options.include_usage` asks for) gives the counts; the
stream is complete at `data: [DONE]`.

`llama` (POST /completion, llama-server's own API): events are `data: {"content", "tokens",
"stop": false}`; the last one has `stop: true` with `tokens_predicted`, `tokens_evaluated` and
`timings`; there is no [DONE].

Both: an event holding `error` ends the request as failed with the server's message. A stream
that ends before its completion marker is failed by the client, not here.
"""

from __future__ import annotations

import json
from typing import Any

from slotserver.bench.config import BenchConfig
from slotserver.bench.dataset import Prompt
from slotserver.bench.record import RequestRecord


class StreamError(Exception):
    """The stream said the request failed, or sent something unreadable; the message says what."""


def error_message(obj: Any) -> str:
    """The human part of an error object in llama-server's, OpenAI's or a plain shape."""
    err = obj.get("error", obj) if isinstance(obj, dict) else obj
    if isinstance(err, dict):
        return str(err.get("message") or err.get("detail") or json.dumps(err))
    return str(err)


def _parse(payload: str) -> dict:
    try:
        obj = json.loads(payload)
    except json.JSONDecodeError:
        raise StreamError(f"unreadable stream event: {payload[:120]!r}") from None
    if not isinstance(obj, dict):
        raise StreamError(f"stream event is not a JSON object: {payload[:120]!r}")
    if "error" in obj:
        raise StreamError(f"error in stream: {error_message(obj)}")
    return obj


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _first(*values: int | None) -> int | None:
    return next((v for v in values if v is not None), None)


class OpenAIFormat:
    name = "openai"
    path = "/v1/completions"
    end_marker = "data: [DONE]"

    def body(self, cfg: BenchConfig, prompt: Prompt, model: str | None) -> dict:
        body = {"prompt": prompt.wire(), "max_tokens": cfg.output_len, "temperature": cfg.temperature,
                "stream": True, "stream_options": {"include_usage": True}, "ignore_eos": True}
        if model:
            body["model"] = model
        return body

    def on_event(self, payload: str, record: RequestRecord, t: float) -> bool:
        """Apply one event to `record`; True when it completes the stream."""
        if payload.strip() == "[DONE]":
            return True
        obj = _parse(payload)
        choices = obj.get("choices") or []
        if choices and isinstance(choices[0], dict) and choices[0].get("text"):
            logprobs = choices[0].get("logprobs") or {}
            tokens = logprobs.get("tokens") if isinstance(logprobs, dict) else None
            record.add_chunk(t, len(tokens) if isinstance(tokens, list) and tokens else None)
        usage = obj.get("usage")
        if isinstance(usage, dict):
            record.reported_output = _first(_count(usage.get("completion_tokens")), record.reported_output)
            record.reported_input = _first(_count(usage.get("prompt_tokens")), record.reported_input)
        return False


class LlamaFormat:
    name = "llama"
    path = "/completion"
    end_marker = "a `stop: true` event"

    def body(self, cfg: BenchConfig, prompt: Prompt, model: str | None) -> dict:
        return {"prompt": prompt.wire(), "n_predict": cfg.output_len, "temperature": cfg.temperature,
                "stream": True, "ignore_eos": True, "cache_prompt": False}

    def on_event(self, payload: str, record: RequestRecord, t: float) -> bool:
        obj = _parse(payload)
        tokens = obj.get("tokens")
        n = len(tokens) if isinstance(tokens, list) and tokens else None
        if n or obj.get("content"):
            record.add_chunk(t, n)
        if obj.get("stop") is not True:
            return False
        timings = obj.get("timings") if isinstance(obj.get("timings"), dict) else {}
        record.reported_output = _first(_count(obj.get("tokens_predicted")),
                                        _count(timings.get("predicted_n")))
        record.reported_input = _count(obj.get("tokens_evaluated"))
        return True


FORMATS = {"openai": OpenAIFormat(), "llama": LlamaFormat()}
