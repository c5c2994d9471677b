"""One streaming benchmark request over httpx, timed chunk by chunk, never raising.

Every way a request can go wrong ends in `record.fail(message)`: an HTTP status other than 200
(with the server's error message), an error event inside the stream, an unreadable event, a
stream that ends (cleanly or by a dropped connection) before its completion marker, a timeout,
a refused connection. The runner counts these; nothing is retried or hidden.

The clock starts just before the request is sent (after any wait for a concurrency slot, as in
vLLM), and every event decoded from one network read gets that read's arrival time.
"""

from __future__ import annotations

import json
import time

import httpx

from slotserver.bench.config import BenchConfig
from slotserver.bench.dataset import Prompt
from slotserver.bench.record import RequestRecord
from slotserver.bench.sse import SSEDecoder
from slotserver.bench.streams import FORMATS, StreamError, error_message

MAX_ERROR_CHARS = 300


def headers(api_key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def http_error(status: int, body: bytes) -> str:
    """`HTTP 503: Loading model`, with the server's message when its body is a JSON error."""
    text = body.decode("utf-8", "replace").strip()
    try:
        text = error_message(json.loads(text))
    except (json.JSONDecodeError, ValueError):
        pass
    return f"HTTP {status}: {text[:MAX_ERROR_CHARS] or '(empty body)'}"


async def _read_stream(response: httpx.Response, fmt, record: RequestRecord) -> None:
    decoder = SSEDecoder()
    async for data in response.aiter_bytes():
        t = time.perf_counter()
        for payload in decoder.feed(data):
            if fmt.on_event(payload, record, t):
                record.finish(t)
                return
    cut = " (inside an event)" if decoder.pending else ""
    record.fail(f"the stream ended before {fmt.end_marker}{cut}")


async def send_request(http: httpx.AsyncClient, cfg: BenchConfig, prompt: Prompt, index: int,
                       model: str | None) -> RequestRecord:
    """Send one streaming completion for `prompt` and record how it went."""
    fmt = FORMATS[cfg.backend]
    record = RequestRecord(index=index, prompt_tokens=prompt.n_tokens)
    body = fmt.body(cfg, prompt, model)
    record.start = time.perf_counter()
    try:
        async with http.stream("POST", cfg.base_url + fmt.path, json=body,
                               headers=headers(cfg.api_key)) as response:
            if response.status_code != 200:
                record.fail(http_error(response.status_code, await response.aread()))
                return record
            await _read_stream(response, fmt, record)
    except StreamError as e:
        record.fail(str(e)[:MAX_ERROR_CHARS])
    except httpx.HTTPError as e:
        record.fail(f"{type(e).__name__}: {str(e)[:MAX_ERROR_CHARS] or 'no details'}")
    return record
