"""Server-sent events, decoded incrementally: network reads in, complete `data` payloads out.

A network read can end anywhere: inside a line, between `\\r` and `\\n`, inside a multi-byte
UTF-8 character. The decoder therefore buffers bytes and only decodes complete lines, and only
hands out an event once its terminating blank line has arrived. Following the SSE spec: lines end
with `\\n` or `\\r\\n`; `:` lines are comments; several `data:` lines of one event are joined with
`\\n`; one space after `data:` is dropped; other fields (`event`, `id`, `retry`) are ignored; an
event still open when the stream ends is discarded (it was never terminated, so it may be cut).
"""

from __future__ import annotations


class SSEDecoder:
    def __init__(self) -> None:
        self._buffer = b""
        self._data: list[str] = []

    def feed(self, chunk: bytes) -> list[str]:
        """The payloads of the events that `chunk` completes, in order."""
        self._buffer += chunk
        out: list[str] = []
        while True:
            end = self._buffer.find(b"\n")
            if end < 0:
                return out
            raw, self._buffer = self._buffer[:end], self._buffer[end + 1:]
            payload = self._line(raw.removesuffix(b"\r").decode("utf-8", "replace"))
            if payload is not None:
                out.append(payload)

    def _line(self, line: str) -> str | None:
        if not line:
            if not self._data:
                return None
            payload, self._data = "\n".join(self._data), []
            return payload
        if line.startswith(":"):
            return None
        field, _, value = line.partition(":")
        if field == "data":
            self._data.append(value.removeprefix(" "))
        return None

    @property
    def pending(self) -> bool:
        """True when bytes or an unterminated event are waiting (the stream was cut there)."""
        return bool(self._buffer or self._data)
