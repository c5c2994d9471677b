"""A bare asyncio client for one streamed generation (playground/http_overhead.py's load).

Why not httpx: at 64 streams the client shares the host's cores with the server it measures, and
httpx + an SSE decoder + `json.loads` per event cost about as much CPU per token as the server's
own work. This reads HTTP/1.1 chunked framing by hand (uvicorn sends one chunk per SSE event),
timestamps each event, and parses JSON only for the last chunk (the token count the server
reports, checked against what was asked).
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field


@dataclass
class StreamResult:
    n_tokens: int = 0                 # generated tokens the server reported (usage / tokens_predicted)
    tpot_ms: float = 0.0              # the server's timings.predicted_per_token_ms (engine-side, first token excluded)
    n_events: int = 0                 # events that carried generated text or ids
    ttft_s: float = 0.0
    gaps_s: list[float] = field(default_factory=list)   # between those events, the first excluded


def _request(host: str, port: int, path: str, body: dict) -> bytes:
    payload = json.dumps(body).encode()
    head = (f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(payload)}\r\nConnection: close\r\n\r\n")
    return head.encode() + payload


async def _chunks(reader: asyncio.StreamReader):
    """The bodies of an HTTP/1.1 chunked response, as they arrive."""
    while True:
        size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
        if size == 0:
            return
        data = await reader.readexactly(size + 2)
        yield data[:-2]


def _final(payload: bytes) -> tuple[int, float] | None:
    """(generated tokens, the server's ms per token) of a closing chunk, None for any other chunk."""
    if b'"usage"' in payload and b'"finish_reason":null' not in payload:   # chat: the finish chunk
        chunk = json.loads(payload)
        return chunk["usage"]["completion_tokens"], chunk["timings"]["predicted_per_token_ms"]
    if b'"stop":true' in payload:                                           # /completion: the summary
        chunk = json.loads(payload)
        return chunk["tokens_predicted"], chunk["timings"]["predicted_per_token_ms"]
    return None


async def stream(host: str, port: int, path: str, body: dict) -> StreamResult:
    t0 = time.perf_counter()
    reader, writer = await asyncio.open_connection(host, port)
    out, last = StreamResult(), None
    try:
        writer.write(_request(host, port, path, body))
        head = await reader.readuntil(b"\r\n\r\n")
        if not head.startswith(b"HTTP/1.1 200") or b"chunked" not in head.lower():
            raise RuntimeError(f"{path}: {head[:200]!r} {await reader.read(500)!r}")
        async for chunk in _chunks(reader):
            now = time.perf_counter()
            for payload in chunk.split(b"\n\n"):
                payload = payload.removeprefix(b"data: ")
                if not payload or payload == b"[DONE]" or b'"role":"assistant"' in payload:
                    continue
                final = _final(payload)
                if final is not None:
                    out.n_tokens, out.tpot_ms = final
                    continue
                out.n_events += 1
                if last is None:
                    out.ttft_s = now - t0
                else:
                    out.gaps_s.append(now - last)
                last = now
    finally:
        writer.close()
    return out
