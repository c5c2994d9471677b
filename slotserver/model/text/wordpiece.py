"""BERT's WordPiece vocabularies (GGUF `tokenizer.ggml.model == "bert"`), as llama.cpp's WPM tokenizer.

llama.cpp's converter stores a WordPiece vocabulary in its own form: a word-initial piece gets a
`▁` prefix (`hello` -> `▁hello`), a continuation loses its `##` (`##llo` -> `llo`), control tokens
(`[CLS]`, `[SEP]`, ...) stay as they are. Its tokenizer (`llm_tokenizer_wpm_session`):

- normalizes per code point: NFD and accent marks dropped when `strip_accents`, lowercase when
  `tokenizer.ggml.normalizer.lowercase` (strip_accents defaults to it), control characters dropped;
- splits words on whitespace, and makes each punctuation character, ASCII symbol and CJK ideograph
  a word of its own;
- matches each word greedily, longest piece first; a word with an unmatched rest is `[UNK]`;
- `add_special` puts `[CLS]` (bos) first and `[SEP]` last, whatever add_bos/add_eos say.

The `tokenizers` library does that work here: its WordPiece model over the vocabulary turned back
into `##` form, BertNormalizer and BertPreTokenizer (their rules are the same as llama.cpp's for
what BERT vocabularies hold; no word-length cut-off, which llama.cpp does not have). Control
tokens are split out of the text with `parse_special`, as for the other tokenizers. Decoding is
the base class's: `▁` becomes a space, continuations join the word (llama.cpp's token_to_piece).
"""

from __future__ import annotations

from typing import Any

from tokenizers import AddedToken, normalizers, pre_tokenizers
from tokenizers import Tokenizer as _HFTokenizer
from tokenizers.models import WordPiece

from slotserver.errors import TokenizerError
from slotserver.model.text.pieces import piece_tables
from slotserver.model.text.special_tokens import CONTROL, NORMAL, UNKNOWN, USER_DEFINED, find_special_tokens, meta_id
from slotserver.model.text.tokenizer import Tokenizer, token_table

_P = "tokenizer.ggml."
PHANTOM = "▁"                 # llama.cpp's word-start mark in a WPM vocabulary
NO_WORD_LIMIT = 1 << 30        # HF WordPiece turns words above 100 characters into [UNK]; llama.cpp does not
# llama.cpp's defaults for a `bert` vocabulary without the ids in its metadata (llama-vocab.cpp)
DEFAULT_IDS = {"bos_token_id": 101, "unknown_token_id": 100, "seperator_token_id": 102, "padding_token_id": 0,
               "mask_token_id": 103}


def wordpiece_vocab(tokens: list[str], types: list[int]) -> dict[str, int]:
    """llama.cpp's GGUF form -> `tokenizers`' WordPiece form (`▁w` -> `w`, `c` -> `##c`, controls as is).

    A repeated form keeps its last id, as llama.cpp's text -> id map does."""
    vocab: dict[str, int] = {}
    for i, (text, kind) in enumerate(zip(tokens, types)):
        if kind != NORMAL:
            vocab[text] = i
        elif text.startswith(PHANTOM):
            if len(text) > len(PHANTOM):
                vocab[text[len(PHANTOM):]] = i
        else:
            vocab["##" + text] = i
    return vocab


class WordPieceTokenizer(Tokenizer):
    """A llama.cpp-compatible WPM tokenizer; same interface as `Tokenizer` (built by its from_metadata)."""

    def __init__(self, md: dict[str, Any]) -> None:  # noqa: D107 - the base __init__ is not called on purpose
        self._tokens, types = token_table(md)
        n = self.vocab_size = len(self._tokens)
        self._vocab = dict(zip(self._tokens, range(n)))
        self.model, self.pre = "bert", str(md.get(_P + "pre") or "default")
        special = find_special_tokens(md, self._tokens, self._vocab, types, DEFAULT_IDS["bos_token_id"], None)
        self._types = special.types
        self.bos_id, self.eos_id, self.eog_ids = special.bos_id, special.eos_id, special.eog_ids
        self.special_ids = dict(special.ids)
        self.sep_id = meta_id(md, "seperator_token_id", DEFAULT_IDS["seperator_token_id"], n)
        self.unk_id = meta_id(md, "unknown_token_id", DEFAULT_IDS["unknown_token_id"], n)
        if self.bos_id is None or self.sep_id is None or self.unk_id is None:
            raise TokenizerError("a bert vocabulary needs [CLS] (bos), [SEP] and [UNK] ids within the vocabulary")
        # llama.cpp: WPM add_special always writes [CLS] .. [SEP]; these flags shape rerank prompts only
        self.add_bos = bool(md.get(_P + "add_bos_token", True))
        self.add_eos = bool(md.get(_P + "add_eos_token", False)) and self.eos_id is not None
        self.add_sep = bool(md.get(_P + "add_sep_token", True))
        self.add_space_prefix, self.clean_spaces = False, True
        self.lowercase = bool(md.get(_P + "normalizer.lowercase", False))
        self.strip_accents = bool(md.get(_P + "normalizer.strip_accents", self.lowercase))
        model = WordPiece(wordpiece_vocab(self._tokens, self._types), unk_token=self._tokens[self.unk_id],
                          max_input_chars_per_word=NO_WORD_LIMIT)
        self._hf_plain = self._wpm_frontend(model, encode_special_as_text=True)
        self._hf_special = self._wpm_frontend(model, encode_special_as_text=False)
        self._bytes, self._special_bytes = piece_tables(self._tokens, self._types, spm=True)

    def _wpm_frontend(self, model: WordPiece, encode_special_as_text: bool) -> _HFTokenizer:
        """BertNormalizer + BertPreTokenizer over the shared model; control (and unknown) tokens
        are split out of the raw text unless encoded as text, user-defined tokens always are."""
        hf = _HFTokenizer(model)
        hf.normalizer = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True,
                                                   strip_accents=self.strip_accents, lowercase=self.lowercase)
        hf.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        specials = [i for i, t in enumerate(self._types) if t in (CONTROL, UNKNOWN)]
        user = [i for i, t in enumerate(self._types) if t == USER_DEFINED]
        hf.add_special_tokens([AddedToken(self._tokens[i], special=True, normalized=False) for i in specials])
        hf.add_tokens([AddedToken(self._tokens[i], special=False, normalized=False) for i in user])
        hf.encode_special_tokens = encode_special_as_text
        return hf

    def encode(self, text: str, add_special: bool = True, parse_special: bool = False) -> list[int]:
        """Token ids of `text`; add_special wraps them in [CLS] ... [SEP] (llama.cpp's WPM rule)."""
        ids: list[int] = [self.bos_id] if add_special else []   # type: ignore[list-item]
        ids += self._encode_text(text, parse_special)
        if add_special:
            ids.append(self.sep_id)   # type: ignore[arg-type]
        return ids

    def drop_added_specials(self, prompt: str) -> str:
        """Rendered prompts keep their text: [CLS]/[SEP] written by a template stay as written."""
        return prompt
