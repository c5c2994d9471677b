"""llama.cpp's `token_to_piece` for every token at once: the bytes each token stands for.

- normal tokens: byte-level BPE vocabularies (gpt2) store each byte as a printable character
  (GPT-2's `bytes_to_unicode`), undone here; SentencePiece vocabularies (llama) store spaces as
  `▁`, turned back into spaces;
- byte tokens `<0xXX>` (SentencePiece byte fallback) are that one byte;
- user-defined tokens are their text as is (no `▁` unescaping, like llama.cpp);
- control and unknown tokens are their text only when special tokens are rendered;
- unused and undefined tokens render as nothing.

Tables are built with one string operation over the whole vocabulary where possible, since a
per-token Python loop is a noticeable part of loading a 262k vocabulary.
"""

from __future__ import annotations

import codecs

from slotserver.model.text.special_tokens import BYTE, CONTROL, NORMAL, UNKNOWN, USER_DEFINED

__all__ = ["piece_tables"]

_SEP = "\x00"   # joins SentencePiece texts (their byte tokens are "<0xNN>" texts, not raw bytes)
# Byte-level pieces are joined with the pieces of bytes 00 01 02 03: "\x00" alone is the byte of the
# piece "Ā", which every GPT-2-style vocabulary has (so the joined fast path never held for them: 151k
# per-piece calls, 0.12 s of a qwen2 load). Four distinct bytes have no border, so a piece's end
# cannot form the separator with its start; a piece holding all four is caught by the count check.
_BYTE_SEP = "\u0100\u0101\u0102\u0103"


def _byte_level_table() -> dict[int, str]:
    """`str.translate` table undoing GPT-2's `bytes_to_unicode`: each character becomes the
    latin-1 character of its byte. Other characters below 256 become their UTF-8 bytes (as
    latin-1 characters) so the result always encodes with latin-1."""
    keep = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    table, extra = {}, 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[256 + extra] = chr(b)
            table[b] = chr(b).encode().decode("latin-1")
            extra += 1
    return table


_BYTE_LEVEL = _byte_level_table()


def _utf8_passthrough(err: UnicodeEncodeError) -> tuple[str, int]:
    """latin-1 encode error handler: a character outside latin-1 becomes its UTF-8 bytes."""
    return err.object[err.start:err.end].encode().decode("latin-1"), err.end


_PASSTHROUGH = "slotserver-utf8-passthrough"
codecs.register_error(_PASSTHROUGH, _utf8_passthrough)


def _byte_level_bytes(piece: str) -> bytes:
    """Raw bytes of a byte-level BPE piece; characters outside the map pass through as UTF-8.
    (Every character below 256 is a key of the map, so those left after `translate` are the
    characters above 255 that the map does not name.)"""
    return piece.translate(_BYTE_LEVEL).encode("latin-1", _PASSTHROUGH)


def _normal_bytes(texts: list[str], spm: bool) -> list[bytes]:
    """Bytes of normal tokens: one translate/encode over the joined texts when that is exact."""
    if spm:
        parts = _SEP.join(texts).replace("▁", " ").encode().split(_SEP.encode())
    else:   # raw (non-mapped) characters, as in qwen2's vocabulary, pass through as UTF-8
        parts = _byte_level_bytes(_BYTE_SEP.join(texts)).split(_byte_level_bytes(_BYTE_SEP))
    if len(parts) == len(texts):  # no token produced the separator byte itself
        return parts
    if spm:
        return [t.replace("▁", " ").encode() for t in texts]
    return [_byte_level_bytes(t) for t in texts]


def piece_tables(tokens: list[str], types: list[int],
                 spm: bool) -> tuple[list[bytes], dict[int, bytes]]:
    """(bytes of every token without special rendering, bytes of control/unknown tokens).

    `spm` selects SentencePiece unescaping (`▁` -> space) over byte-level decoding.
    """
    other = [i for i, kind in enumerate(types) if kind != NORMAL]   # the few special kinds
    texts = list(tokens)
    for i in other:
        texts[i] = ""
    table = _normal_bytes(texts, spm)   # every token as normal, then the others put right
    special: dict[int, bytes] = {}
    for i in other:
        text, kind = tokens[i], types[i]
        table[i] = b""
        if kind in (CONTROL, UNKNOWN):
            special[i] = text.encode()
        elif kind == USER_DEFINED:
            table[i] = text.encode()
        elif kind == BYTE and spm and len(text) == 6 and text.startswith("<0x"):
            table[i] = bytes([int(text[3:5], 16)])
    return table, special
