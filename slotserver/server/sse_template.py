"""A streamed chunk whose JSON is fixed but for a few values: encoded once, filled per token.

Why: a stream sends one chunk per token, and all but a few of its bytes are the same every time
(OpenAI's envelope: id, object, created, model, fingerprint, index; llama-server's index and
prompt size). Building the dict and running `json.dumps` over it per token was ~7 us of the event
loop's ~45 us per streamed token at 64 streams (py-spy, docs/performance.md); encoding the one
string that changes and joining bytes takes ~0.4 us.

Exactness: the template is the very output of `jsonio.dumps` for the chunk with a marker string
in each hole, split at the markers' encodings; a hole's value is encoded as `dumps` would encode it
in place (a string by the same C encoder, an int by `int.__repr__`, the whole bytes replaced as
`dumps` replaces a lone surrogate). So a filled template is byte for byte `sse.event(chunk)`:
tests/test_sse_template.py compares the two on awkward text. A template whose markers do not come
out exactly once (a model name that holds one, say) is not used: `SSETemplate.make` gives None.
"""

from __future__ import annotations

from json.encoder import encode_basestring
from typing import Any

from slotserver.server.jsonio import dumps

_MARK = "\x00slotserver-hole-{}\x00"


def hole(i: int) -> str:
    """The placeholder for hole `i` in the object given to `SSETemplate.make`."""
    return _MARK.format(i)


def json_str(text: str) -> bytes:
    """`text` as a JSON string, as `jsonio.dumps` writes it inside an object."""
    return encode_basestring(text).encode("utf-8", "replace")


def json_ints(values: list[int]) -> bytes:
    """A list of ints as `jsonio.dumps` writes it: `[1,2,3]`."""
    return ("[" + ",".join(map(str, values)) + "]").encode()


class SSETemplate:
    """`fill(*values)`: the SSE event `data: <json>\\n\\n` with each hole's encoded bytes."""

    def __init__(self, parts: list[bytes]) -> None:
        self._head, self._rest = b"data: " + parts[0], parts[1:-1]
        self._tail = parts[-1] + b"\n\n"

    @classmethod
    def make(cls, obj: Any, n_holes: int) -> "SSETemplate | None":
        """`obj` holds `hole(0) .. hole(n_holes - 1)`, each where a value goes, once."""
        text = dumps(obj)
        parts = [text]
        for i in range(n_holes):
            head, *rest = parts[-1].split(json_str(hole(i)))
            if len(rest) != 1:
                return None
            parts[-1:] = [head, rest[0]]
        return cls(parts)

    def fill(self, *values: bytes) -> bytes:
        if not self._rest:
            return self._head + values[0] + self._tail
        out = [self._head]
        for value, part in zip(values, self._rest):
            out += (value, part)
        out += (values[-1], self._tail)
        return b"".join(out)
