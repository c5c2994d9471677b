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
from typing import TYPE_CHECKING, Iterable

if TYPE_CHECKING:  # the engine streams text through here; building tokenizers needs numpy
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


def detokenize(tokenizer: Tokenizer, ids: Iterable[int], remove_special: bool = False,
               unparse_special: bool = False) -> str:
    """llama.cpp's `llama_detokenize` (what `common_detokenize` gives llama-server's "prompt"
    fields): the pieces joined, then llama.cpp's space rules, where `Tokenizer.decode` (what
    `/detokenize` and streaming give) only joins the pieces.

    - the first piece loses one leading space when the model prefixes text with one
      (SentencePiece `add_space_prefix`), unless a removed BOS came first;
    - remove_special drops a leading BOS / trailing EOS that the model adds itself;
    - byte-level models with `clean_spaces` get " ?" -> "?", " ' " -> "'", " 's" -> "'s"...
    """
    ids = list(ids)
    remove_space = tokenizer.add_space_prefix
    if remove_special and tokenizer.add_bos and ids and ids[0] == tokenizer.bos_id:
        remove_space, ids = False, ids[1:]
    if remove_special and tokenizer.add_eos and ids and ids[-1] == tokenizer.eos_id:
        ids = ids[:-1]
    pieces = [tokenizer.token_bytes(i, unparse_special) for i in ids]
    if remove_space and pieces and pieces[0].startswith(b" "):
        pieces[0] = pieces[0][1:]
    text = b"".join(pieces)
    if tokenizer.clean_spaces:
        text = _clean_spaces(text)
    return text.decode("utf-8", "replace")


def _clean_spaces(text: bytes) -> bytes:
    """The three in-place passes of llama_vocab::impl::detokenize's clean_spaces, ported as is."""
    out = bytearray(text)
    out = _drop_space_before(out, lambda i: out[i] in b"?!.,")
    buf, total, i = out, 1 if out else 0, 1
    while i < len(buf):  # " ' " -> "'"
        x = buf[i]
        if x == ord("'") and i + 1 < len(buf) and buf[i - 1] == 32 and buf[i + 1] == 32:
            total -= 1
            i += 1
            buf[i] = 0
        buf[total] = x
        total, i = total + 1, i + 1
    out = buf[:total]

    def contraction(i: int) -> bool:  # " 's", " 'm", " 're", " 've" (not " 't", " 'd", " 'll")
        if out[i] != ord("'") or i + 1 >= len(out):
            return False
        rest = bytes(out[i + 1:i + 3])
        return rest[:1] in (b"s", b"m") or (len(rest) == 2 and rest in (b"re", b"ve"))

    return bytes(_drop_space_before(out, contraction))


def _drop_space_before(buf: bytearray, drop: object) -> bytearray:
    """Copy `buf`, removing a space that precedes a byte for which `drop(index)` holds."""
    total = 1 if buf else 0
    for i in range(1, len(buf)):
        x = buf[i]
        if buf[i - 1] == 32 and drop(i):  # type: ignore[operator]
            total -= 1
        buf[total] = x
        total += 1
    return buf[:total]
