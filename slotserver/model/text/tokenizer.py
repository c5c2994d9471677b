"""Text <-> token ids, built from GGUF metadata, matching llama.cpp's tokenizer id for id.

The heavy lifting (BPE merging, special-token splitting) is done by the `tokenizers` library;
this module only configures it the way llama.cpp's `llama-vocab.cpp` behaves:

- `gpt2` models: byte-level BPE with the pre-tokenizer regexes llama.cpp picks by
  `tokenizer.ggml.pre` (the table is in `pretokenizers.py`), applied in sequence with every
  match isolated (`unicode_regex_split`).
- `llama` models (SentencePiece: llama 2, gemma 2/3, phi-3): BPE whose merges come from the piece
  scores (`spm_merges.py`; llama.cpp's SPM tokenizer is a score-driven bigram merge, which a
  score-ranked BPE reproduces and a Unigram model does not), byte fallback to `<0xXX>` tokens,
  spaces escaped as `▁`, and, with `add_space_prefix`, a `▁` before every text fragment that
  starts the input or follows a special token (llama.cpp's `is_prev_special`).
- Control/unknown tokens are split out of the text only with `parse_special`; user-defined tokens
  always are. llama.cpp's load-time corrections of token types (EOG tokens become control, ...)
  are in `special_tokens.py`. Two `tokenizers` front ends share one BPE model so that no state is
  toggled per call (thread safety).

Decoding never goes through `tokenizers`: a per-token byte table reproduces llama.cpp's
`token_to_piece` (`pieces.py`), so text can also be rebuilt incrementally (`detokenizer.py`).
"""

from __future__ import annotations

from itertools import repeat
from typing import Any, Iterable

from tokenizers import AddedToken, normalizers
from tokenizers import Tokenizer as _HFTokenizer
from tokenizers.models import BPE

from slotserver.errors import TokenizerError  # noqa: F401  re-export: defined without torch in slotserver.errors
from slotserver.model.text.pieces import piece_tables
from slotserver.model.text.pretokenizers import PRE_RULES, SUPPORTED_PRE, build_pre_tokenizer
from slotserver.model.text.special_tokens import (CONTROL, NORMAL, UNKNOWN, USER_DEFINED,
                                                  find_special_tokens, meta_id)
from slotserver.model.text.spm_merges import no_gc, spm_merges

__all__ = ["SUPPORTED_PRE", "Tokenizer", "TokenizerError"]

_P = "tokenizer.ggml."


def _bpe_merges(vocab: dict[str, int], raw: list[str]) -> list[tuple[str, str]]:
    """Parse "a b" merges, dropping those `tokenizers` cannot represent (a part or result OOV:
    its BPE constructor raises on the first, panics on the second). The common case (one space
    in every merge, all in the vocabulary) is parsed and checked without a per-merge Python step:
    the loop took 0.17 s of a 151k-merge vocabulary's load, this ~0.04 s."""
    words = " ".join(raw).split(" ")
    if len(words) == 2 * len(raw) and all(map(str.__contains__, raw, repeat(" "))):   # one space in each
        a, b = words[::2], words[1::2]
        if all(map(vocab.__contains__, words)) and all(map(vocab.__contains__, map(str.__add__, a, b))):
            return list(zip(a, b))
    pairs = (line.split(" ", 1) for line in raw)
    return [(p[0], p[1]) for p in pairs
            if len(p) == 2 and p[0] in vocab and p[1] in vocab and p[0] + p[1] in vocab]


def _added_ids(types: list[int]) -> tuple[list[int], list[int]]:
    """(control and unknown ids, user-defined ids): the tokens split out of the text."""
    return ([i for i, t in enumerate(types) if t == CONTROL or t == UNKNOWN],
            [i for i, t in enumerate(types) if t == USER_DEFINED])


def token_table(md: dict[str, Any]) -> tuple[list[str], list[int]]:
    """(token texts, token types) of GGUF metadata: an empty text named `[EMPTY_i]`, types NORMAL
    where the file has none; TokenizerError for no tokens or a type list of another length."""
    tokens = md.get(_P + "tokens")
    if not tokens:
        raise TokenizerError("GGUF metadata has no tokenizer.ggml.tokens")
    texts = [t or f"[EMPTY_{i}]" for i, t in enumerate(tokens)]
    types = list(md.get(_P + "token_type") or [NORMAL] * len(texts))
    if len(types) != len(texts):
        raise TokenizerError(f"token_type has {len(types)} entries for {len(texts)} tokens")
    return texts, types


class Tokenizer:
    """A llama.cpp-compatible tokenizer; build it with `Tokenizer.from_metadata(gguf_kv)`."""

    def __init__(self, md: dict[str, Any]) -> None:
        self._tokens, types = token_table(md)
        n = self.vocab_size = len(self._tokens)
        self._vocab = dict(zip(self._tokens, range(n)))  # a repeated text means its last id
        self.model = str(md.get(_P + "model", ""))
        if self.model == "gpt2":
            bpe, add_bos = self._init_bpe(md), None
            default = None if "no_bos" in PRE_RULES[self.pre][1] else 11  # llama.cpp's BPE ids
            special = find_special_tokens(md, self._tokens, self._vocab, types, default, default)
        elif self.model == "llama":
            special = find_special_tokens(md, self._tokens, self._vocab, types, 1, 2)
            bpe, add_bos = self._init_spm(md, special.types), True  # llama.cpp's SPM defaults
        else:
            raise TokenizerError(f"unsupported tokenizer model {self.model!r} (need gpt2, llama, bert or t5)")
        self._types = special.types
        self.bos_id, self.eos_id, self.eog_ids = special.bos_id, special.eos_id, special.eog_ids
        self.special_ids = dict(special.ids)
        self._init_add_special(md, self._add_bos_default if add_bos is None else add_bos)
        added = _added_ids(special.types)   # once for both frontends (151k types: ~10 ms a pass)
        self._hf_plain = self._frontend(bpe, special.rstrip, added, encode_special_as_text=True)
        self._hf_special = self._frontend(bpe, special.rstrip, added, encode_special_as_text=False)
        self._bytes, self._special_bytes = piece_tables(self._tokens, self._types,
                                                        spm=self.model == "llama")

    @classmethod
    def from_metadata(cls, md: dict[str, Any]) -> Tokenizer:
        """Build from GGUF key/values given as plain Python values."""
        if cls is Tokenizer and md.get(_P + "model") == "bert":   # WordPiece (BERT): text/wordpiece.py
            from slotserver.model.text.wordpiece import WordPieceTokenizer
            return WordPieceTokenizer.from_metadata(md)
        if cls is Tokenizer and md.get(_P + "model") == "t5":     # SentencePiece unigram: text/unigram.py
            from slotserver.model.text.unigram import UnigramTokenizer
            return UnigramTokenizer.from_metadata(md)
        with no_gc():
            return cls(md)

    def _init_add_special(self, md: dict[str, Any], add_bos: bool) -> None:
        """Whether encode(add_special=True) adds BOS/EOS; metadata keys win over defaults.

        A default add_bos without any BOS id is dropped; an explicit one is an error.
        """
        self.add_bos = bool(md.get(_P + "add_bos_token", add_bos and self.bos_id is not None))
        self.add_eos = bool(md.get(_P + "add_eos_token", False))
        for name, wanted, tid in (("bos", self.add_bos, self.bos_id),
                                  ("eos", self.add_eos, self.eos_id)):
            if wanted and tid is None:
                raise TokenizerError(f"add_{name}_token is set but the model has no {name} token")

    def _init_bpe(self, md: dict[str, Any]) -> BPE:
        """Byte-level BPE; the pre-tokenizer name picks the regexes and llama.cpp's defaults."""
        self.pre = str(md.get(_P + "pre") or "default")  # llama.cpp: missing -> 'default'
        if self.pre not in PRE_RULES:
            raise TokenizerError(f"unsupported pre-tokenizer {self.pre!r}; "
                                 f"supported: {', '.join(sorted(PRE_RULES))}")
        regexes, flags = PRE_RULES[self.pre]
        if md.get(_P + "merges") is None:
            raise TokenizerError("gpt2 tokenizer without tokenizer.ggml.merges")
        self._normalizer: normalizers.Normalizer | None = None
        self._regexes: tuple[str, ...] | None = regexes
        self._add_bos_default = "add_bos" in flags
        self.add_space_prefix = False
        self.clean_spaces = "keep_spaces" not in flags
        merges = _bpe_merges(self._vocab, md[_P + "merges"])
        return BPE(self._vocab, merges, ignore_merges="ignore_merges" in flags)

    def _init_spm(self, md: dict[str, Any], types: list[int]) -> BPE:
        """SentencePiece: score-derived merges, byte fallback, `▁` escaping and prefix."""
        n = self.vocab_size
        scores = md.get(_P + "scores")
        scores = [0.0] * n if scores is None else scores
        if len(scores) != n:
            raise TokenizerError(f"scores has {len(scores)} entries for {n} tokens")
        unk = meta_id(md, "unknown_token_id", 0, n)
        # user-defined pieces are always split out of the text first, so no merge can form them
        user = frozenset(i for i, t in enumerate(types) if t == USER_DEFINED)
        merges = spm_merges(self._tokens, scores, user)
        self.pre = "default"
        self.add_space_prefix = bool(md.get(_P + "add_space_prefix", True))
        self.clean_spaces = False
        steps = [normalizers.Prepend("▁")] if self.add_space_prefix else []
        self._normalizer = normalizers.Sequence([*steps, normalizers.Replace(" ", "▁")])
        self._regexes = None
        return BPE(self._vocab, merges, byte_fallback=True,
                   unk_token=self._tokens[unk] if unk is not None else None)

    def _frontend(self, bpe: BPE, rstrip: frozenset[int], added_ids: tuple[list[int], list[int]],
                  encode_special_as_text: bool) -> _HFTokenizer:
        """A `tokenizers` instance over the shared model; control tokens are split out of the
        text unless encoded as text, user-defined tokens always are."""
        hf = _HFTokenizer(bpe)
        if self._normalizer is not None:
            hf.normalizer = self._normalizer
        if self._regexes is not None:
            hf.pre_tokenizer = build_pre_tokenizer(self._regexes)

        def added(i: int, special: bool) -> AddedToken:
            return AddedToken(self._tokens[i], special=special, normalized=False,
                              rstrip=i in rstrip)

        control, user = added_ids
        hf.add_special_tokens([added(i, True) for i in control])
        hf.add_tokens([added(i, False) for i in user])
        hf.encode_special_tokens = encode_special_as_text
        return hf

    def encode(self, text: str, add_special: bool = True, parse_special: bool = False) -> list[int]:
        """Token ids of `text`, like llama-server's /tokenize.

        add_special adds BOS/EOS as the model asks (add_bos/add_eos); parse_special lets
        control-token text such as `<|im_start|>` become that token instead of plain text.
        """
        ids: list[int] = [self.bos_id] if add_special and self.add_bos else []   # type: ignore[list-item]
        ids += self._encode_text(text, parse_special)
        if add_special and self.add_eos:
            ids.append(self.eos_id)  # type: ignore[arg-type]
        return ids

    def _encode_text(self, text: str, parse_special: bool) -> list[int]:
        """The ids of `text` alone (no BOS/EOS); TokenizerError for a non-str or untokenizable text."""
        if not isinstance(text, str):
            raise TokenizerError(f"encode expects str, got {type(text).__name__}")
        if not text:
            return []
        backend = self._hf_special if parse_special else self._hf_plain
        try:
            return backend.encode(text, add_special_tokens=False).ids
        except Exception as exc:  # e.g. lone surrogates in the input
            raise TokenizerError(f"cannot tokenize text: {exc}") from exc

    def drop_added_specials(self, prompt: str) -> str:
        """A rendered chat prompt without the BOS (EOS) text the template wrote itself when
        encode(add_special=True) will add that token anyway: llama.cpp's rule after rendering a
        template (common/chat.cpp), which keeps gemma and llama 3 prompts to a single BOS.
        `ChatTemplate.render` applies the same rule itself (its `add_bos`, from this tokenizer)."""
        bos = self.decode([self.bos_id], special=True) if self.bos_id is not None else ""
        eos = self.decode([self.eos_id], special=True) if self.eos_id is not None else ""
        if self.add_bos and bos and prompt.startswith(bos):
            prompt = prompt[len(bos):]
        if self.add_eos and eos and prompt.endswith(eos):
            prompt = prompt[:-len(eos)]
        return prompt

    def token_bytes(self, id: int, special: bool = False) -> bytes:
        """Raw bytes of one token's piece (may be part of a UTF-8 character)."""
        if not 0 <= id < self.vocab_size:
            raise TokenizerError(f"token id {id} out of range [0, {self.vocab_size})")
        if special and id in self._special_bytes:
            return self._special_bytes[id]
        return self._bytes[id]

    def decode(self, ids: Iterable[int], special: bool = False) -> str:
        """Concatenated pieces as text, like llama-server's /detokenize; invalid UTF-8 becomes
        U+FFFD. special=False hides control/unknown tokens, as llama.cpp's token_to_piece does.
        (`detokenizer.detokenize` is llama.cpp's `llama_detokenize`, with its space rules.)
        """
        return b"".join(self.token_bytes(i, special) for i in ids).decode("utf-8", "replace")

    def piece(self, id: int) -> str:
        """The vocabulary string of a token (byte-level or `▁`-escaped form)."""
        if not 0 <= id < self.vocab_size:
            raise TokenizerError(f"token id {id} out of range [0, {self.vocab_size})")
        return self._tokens[id]

    def token_type(self, id: int) -> int:
        """The token's type after llama.cpp's load-time corrections (special_tokens.NORMAL...)."""
        self.piece(id)  # range check
        return self._types[id]

    def token_to_id(self, text: str) -> int | None:
        """Id of the vocabulary string `text`, or None."""
        return self._vocab.get(text)
