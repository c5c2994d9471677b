"""Stop strings that may span token boundaries, with llama-server's streaming hold-back.

Text is released only when no stop string can still start inside it: a tail that is a prefix of
some stop string is held until the next token decides. When a stop string completes, the text
before it is released and the rest (the stop string and anything after) is dropped.
"""

from __future__ import annotations


class StopMatcher:
    def __init__(self, stops: tuple[str, ...]) -> None:
        self.stops = tuple(s for s in stops if s)
        self._held = ""

    def feed(self, text: str) -> tuple[str, str | None]:
        """Add new text; -> (text safe to emit now, the stop string hit or None)."""
        if not self.stops:
            return text, None
        buf = self._held + text
        hit = self._first_full_match(buf)
        if hit is not None:
            pos, word = hit
            self._held = ""
            return buf[:pos], word
        keep = self._partial_tail(buf)
        self._held = buf[len(buf) - keep:] if keep else ""
        return buf[: len(buf) - keep], None

    def flush(self) -> str:
        """At the end of generation, held text that never became a stop string is released."""
        out, self._held = self._held, ""
        return out

    def _first_full_match(self, buf: str) -> tuple[int, str] | None:
        best = None
        for word in self.stops:
            pos = buf.find(word)
            if pos >= 0 and (best is None or pos < best[0]):
                best = (pos, word)
        return best

    def _partial_tail(self, buf: str) -> int:
        """Length of the longest suffix of `buf` that is a proper prefix of a stop string."""
        longest = 0
        for word in self.stops:
            for n in range(min(len(word) - 1, len(buf)), longest, -1):
                if buf.endswith(word[:n]):
                    longest = n
                    break
        return longest
