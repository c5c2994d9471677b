"""Streaming token ids -> text without ever emitting half a UTF-8 character.

A token is a run of bytes, not of characters: byte-level BPE and SentencePiece byte-fallback
tokens regularly split one character (an emoji, a CJK ideograph) across two or more tokens.
Decoding each token on its own would print U+FFFD garbage mid-stream, so the bytes go through
an incremental UTF-8 decoder that holds back an incomplete trailing sequence until it completes.

Bytes that can never become valid UTF-8 are replaced by U+FFFD as soon as that is certain, with
exactly the same replacement rule as `bytes.decode("utf-8", "replace")`. Hence, for any ids,
`"".join(push(i) for i in ids) + flush() == tokenizer.decode(ids, special)`.
"""

from __future__ import annotations

import codecs
from typing import Iterable

from slotserver.model.text.tokenizer import Tokenizer

__all__ = ["IncrementalDetokenizer"]


class IncrementalDetokenizer:
    """Turns tokens into text one at a time for streaming responses.

    Not thread-safe: use one instance per generation stream.
    """

    def __init__(self, tokenizer: Tokenizer, special: bool = False) -> None:
        """`special=True` renders control tokens' text, like `Tokenizer.decode(special=True)`."""
        self._tokenizer = tokenizer
        self._special = special
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._chunks: list[str] = []

    def push(self, token_id: int) -> str:
        """Add one token; return the text it completes (possibly "" while a char is pending)."""
        data = self._tokenizer.token_bytes(token_id, self._special)
        return self._emit(self._decoder.decode(data))

    def extend(self, token_ids: Iterable[int]) -> str:
        """Push several tokens; return the text they complete together."""
        return "".join(self.push(token_id) for token_id in token_ids)

    def flush(self) -> str:
        """End of stream: return what is left, pending incomplete bytes becoming U+FFFD.

        The detokenizer may be reused afterwards; it starts from a clean byte state.
        """
        return self._emit(self._decoder.decode(b"", final=True))

    @property
    def pending(self) -> bool:
        """Whether bytes of an incomplete character are being held back."""
        return bool(self._decoder.getstate()[0])

    @property
    def text(self) -> str:
        """All text emitted so far (by push, extend and flush)."""
        if len(self._chunks) > 1:
            self._chunks = ["".join(self._chunks)]
        return self._chunks[0] if self._chunks else ""

    def _emit(self, text: str) -> str:
        if text:
            self._chunks.append(text)
        return text
