"""SentencePiece unigram vocabularies (GGUF `tokenizer.ggml.model == "t5"`), as llama.cpp's UGM tokenizer.

What such files are: XLM-RoBERTa encoders converted as `bert` (bge-m3, bge-reranker-v2-m3,
multilingual-e5, snowflake-arctic-embed-l-v2), and T5. A transcription of llama.cpp's
`llm_tokenizer_ugm` / `llm_tokenizer_ugm_session` (src/llama-vocab.cpp), because its normalization
is its own walk of the file's `precompiled_charsmap` (a XOR-compressed double array of byte
prefixes and their replacements) and its spaces rule differs from sentencepiece's and the
`tokenizers` library's in the corner cases (runs of spaces, user-defined tokens):

- the text is cut at special tokens first (llama.cpp's `tokenizer_st_partition`: control and
  unknown tokens with `parse_special`, user-defined ones always; longest token text first);
- each piece is normalized prefix by prefix: a user-defined token's text as is, else the longest
  charsmap match's replacement, else one UTF-8 character (a bad byte: U+FFFD); spaces become `▁`,
  one is put before the first word with `add_space_prefix`, runs merge with
  `remove_extra_whitespaces`;
- a Viterbi pass over the normalized bytes picks the pieces with the highest sum of scores
  (user-defined pieces score 0; a character no piece covers is `<unk>` at the lowest normal score
  minus 10, and unknown runs merge into one);
- `add_special`: BOS first where `add_bos_token` (default false), EOS last where `add_eos_token`
  (default true).
Decoding is the base class's SentencePiece form (`▁` -> space).
"""

from __future__ import annotations

import struct
from typing import Any

import numpy as np

from slotserver.errors import TokenizerError
from slotserver.model.text.pieces import piece_tables
from slotserver.model.text.special_tokens import (CONTROL, NORMAL, UNKNOWN, UNUSED, USER_DEFINED, find_special_tokens,
                                                  meta_id)
from slotserver.model.text.tokenizer import Tokenizer, token_table

_P = "tokenizer.ggml."
SPACE = "▁".encode()
UNKNOWN_PENALTY = 10.0


class CharsMap:
    """The precompiled charsmap: `u32 size`, `size` bytes of XCDA nodes, then NUL-terminated replacements."""

    def __init__(self, blob: bytes) -> None:
        if len(blob) < 4:
            raise TokenizerError("precompiled_charsmap too small for its size header")
        (size,) = struct.unpack_from("<I", blob)
        if size + 4 >= len(blob) or size % 4:
            raise TokenizerError("precompiled_charsmap's node array runs past its end")
        self.nodes = struct.unpack_from(f"<{size // 4}I", blob, 4)
        self.replacements = blob[4 + size:]

    def _node(self, i: int) -> int:
        if i >= len(self.nodes):
            raise TokenizerError("precompiled_charsmap: node index out of range")
        return self.nodes[i]

    def _base(self, i: int) -> int:
        n = self._node(i)
        return (n >> 10) << ((n & (1 << 9)) >> 6)

    def longest(self, text: bytes, start: int) -> tuple[int, bytes]:
        """(bytes matched at `start`, their replacement); (0, b"") without a match."""
        best, best_at, node = 0, 0, self._base(0)
        for pos in range(start, len(text)):
            c = text[pos]
            if c == 0:
                break
            node ^= c
            packed = self._node(node)
            if packed & ((1 << 31) | 0xFF) != c:   # LCHECK
                break
            leaf = (packed >> 8) & 1
            node ^= self._base(node)
            if leaf:
                best, best_at = pos - start + 1, self._node(node) & ((1 << 31) - 1)
        if not best:
            return 0, b""
        end = self.replacements.find(b"\0", best_at)
        if best_at >= len(self.replacements) or end < 0:
            raise TokenizerError("precompiled_charsmap: replacement out of range or unterminated")
        return best, self.replacements[best_at:end]


def _f32(x: float) -> float:
    """x rounded to float32 (llama.cpp keeps scores, and the unknown score, in float)."""
    return struct.unpack("<f", struct.pack("<f", x))[0]


def _char_len(lead: int) -> int:
    """llama.cpp's unicode_len_utf8: a UTF-8 sequence's length from its first byte (1 for a stray one)."""
    return (1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4)[lead >> 4]


class UnigramTokenizer(Tokenizer):
    """A llama.cpp-compatible UGM tokenizer; same interface as `Tokenizer` (built by its from_metadata)."""

    def __init__(self, md: dict[str, Any]) -> None:  # noqa: D107 - the base __init__ is not called on purpose
        self._tokens, types = token_table(md)
        n = self.vocab_size = len(self._tokens)
        scores = list(md.get(_P + "scores") or [0.0] * n)
        if len(scores) != n:
            raise TokenizerError(f"scores has {len(scores)} entries for {n} tokens")
        self._vocab = dict(zip(self._tokens, range(n)))
        self.model, self.pre = "t5", "default"
        special = find_special_tokens(md, self._tokens, self._vocab, types, None, 1)   # llama.cpp's t5 defaults
        self._types, self.bos_id, self.eos_id = special.types, special.bos_id, special.eos_id
        self.eog_ids = special.eog_ids
        self.special_ids = dict(special.ids)
        self.unk_id = meta_id(md, "unknown_token_id", 2, n)
        self.sep_id = meta_id(md, "seperator_token_id", None, n)
        if self.unk_id is None:
            raise TokenizerError("a t5 (unigram) vocabulary needs an unknown token id within the vocabulary")
        self.add_bos = bool(md.get(_P + "add_bos_token", False)) and self.bos_id is not None
        self.add_eos = bool(md.get(_P + "add_eos_token", True)) and self.eos_id is not None
        self.add_sep = bool(md.get(_P + "add_sep_token", False))
        self.add_space_prefix = bool(md.get(_P + "add_space_prefix", False))
        self.merge_spaces = bool(md.get(_P + "remove_extra_whitespaces", False))
        self.clean_spaces = False
        charsmap = md.get(_P + "precompiled_charsmap")
        self._charsmap = CharsMap((np.asarray(charsmap, dtype=np.int64) & 0xFF).astype(np.uint8).tobytes()) \
            if charsmap is not None and len(charsmap) else None
        self._init_pieces([_f32(float(s)) for s in scores])
        self._bytes, self._special_bytes = piece_tables(self._tokens, self._types, spm=True)

    def _init_pieces(self, scores: list[float]) -> None:
        """The pieces (normal, user-defined, unused tokens) by their bytes, the longest piece per
        first byte, the user-defined texts longest first, scores (user-defined: 0), the unknown
        score, and the tokens the text is cut at, longest first.

        Why a dict of byte strings and not llama.cpp's trie: the pieces that start at a position are
        the same either way (each prefix looked up, up to the longest piece with that first byte),
        and a trie of dicts for XLM-R's 250k pieces took 400 MB and seconds to build."""
        self._pieces: dict[bytes, int] = {}
        self._longest = [0] * 256
        self._score = list(scores)
        normal = [s for s, t in zip(scores, self._types) if t == NORMAL]
        self._unk_score = _f32(min(normal, default=0.0) - UNKNOWN_PENALTY)
        for i, (text, kind) in enumerate(zip(self._tokens, self._types)):
            raw = text.encode()
            if kind in (NORMAL, USER_DEFINED, UNUSED) and raw:
                self._pieces[raw] = i   # a repeated text: its last id, as llama.cpp's trie keeps
                self._longest[raw[0]] = max(self._longest[raw[0]], len(raw))
            if kind == USER_DEFINED:
                self._score[i] = 0.0
        cut = [i for i, k in enumerate(self._types) if k in (CONTROL, USER_DEFINED, UNKNOWN)]
        self._cut = sorted(cut, key=lambda i: -len(self._tokens[i].encode()))   # stable: ties in id order

    def _encode_text(self, text: str, parse_special: bool) -> list[int]:
        """The ids of `text` alone (no BOS/EOS), llama.cpp's partition then its UGM session per piece."""
        if not isinstance(text, str):
            raise TokenizerError(f"encode expects str, got {type(text).__name__}")
        try:
            raw = text.encode()
        except UnicodeEncodeError as exc:   # a lone surrogate
            raise TokenizerError(f"cannot tokenize text: {exc}") from exc
        ids: list[int] = []
        for part in self._partition(raw, parse_special):
            if isinstance(part, int):
                ids.append(part)
            else:
                ids += self._viterbi(self._normalize(part))
        return ids

    def _partition(self, raw: bytes, parse_special: bool) -> list[bytes | int]:
        """tokenizer_st_partition: for each special token, longest first, every text part cut where it occurs."""
        parts: list[bytes | int] = [raw] if raw else []
        for tid in self._cut:
            if not parse_special and self._types[tid] in (CONTROL, UNKNOWN):
                continue
            needle, out = self._tokens[tid].encode(), []
            for part in parts:
                while isinstance(part, bytes) and needle and (at := part.find(needle)) >= 0:
                    out += [p for p in (part[:at], tid) if p != b""]
                    part = part[at + len(needle):]
                if part != b"":
                    out.append(part)
            parts = out
        return parts

    def _normalize(self, raw: bytes) -> bytes:
        """llm_tokenizer_ugm_session::normalize: prefixes replaced, spaces escaped, prefixed or merged."""
        out, prepended, in_word, at = bytearray(), False, False, 0
        while at < len(raw):
            piece, used = self._normalize_prefix(raw, at)
            for c in piece:
                if c != 0x20:
                    if not in_word:
                        in_word = True
                        if (self.add_space_prefix and not prepended) or self.merge_spaces:
                            out += SPACE
                            prepended = True
                    out.append(c)
                else:
                    in_word = False
                    if not self.merge_spaces:
                        out += SPACE
            at += used
        return bytes(out)

    def _normalize_prefix(self, raw: bytes, at: int) -> tuple[bytes, int]:
        """(replacement, bytes consumed) at `at`: the charsmap's longest match, else one UTF-8
        character (a bad sequence: U+FFFD for one byte). llama.cpp first tries the user-defined
        tokens here; `_partition` has already cut every one of them out of the text (whatever
        parse_special says), so that check could never match and is left out."""
        if self._charsmap is not None:
            used, repl = self._charsmap.longest(raw, at)
            if used:
                return repl, used
        size = _char_len(raw[at])
        if raw[at] & 0xC0 == 0x80 or at + size > len(raw) or any(b & 0xC0 != 0x80 for b in raw[at + 1: at + size]):
            return "\ufffd".encode(), 1
        return raw[at:at + size], size

    def _viterbi(self, norm: bytes) -> list[int]:
        """llm_tokenizer_ugm_session::tokenize on normalized bytes: the best-scoring pieces."""
        n, unk = len(norm), self.unk_id
        if n == 0:
            return []
        best: list[tuple[int, int, float]] = [(unk, 0, -float("inf"))] * (n + 1)   # (id, start, score)
        best[0] = (unk, 0, 0.0)
        at, pieces = 0, self._pieces
        while at < n:
            size, whole, here = min(_char_len(norm[at]), n - at), False, best[at][2]
            for end in range(at + 1, at + min(self._longest[norm[at]], n - at) + 1):   # shortest first
                tid = pieces.get(norm[at:end])
                if tid is None:
                    continue
                whole |= end - at == size
                score = here + self._score[tid]
                if score > best[end][2]:
                    best[end] = (tid, at, score)
            if not whole and here + self._unk_score > best[at + size][2]:
                best[at + size] = (unk, at, here + self._unk_score)
            at += size
        ids, prev_unknown, entry = [], False, best[n]
        while True:
            if not (prev_unknown and entry[0] == unk):
                ids.append(entry[0])
            if entry[1] == 0:
                break
            prev_unknown, entry = entry[0] == unk, best[entry[1]]
        return ids[::-1]

    def encode(self, text: str, add_special: bool = True, parse_special: bool = False) -> list[int]:
        """Token ids of `text`; add_special: BOS first where add_bos, EOS last where add_eos (llama.cpp's UGM)."""
        ids = [self.bos_id] if add_special and self.add_bos else []
        ids += self._encode_text(text, parse_special)
        return ids + [self.eos_id] if add_special and self.add_eos else ids
