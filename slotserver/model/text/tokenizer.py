"""Text <-> token ids, built from GGUF metadata, matching llama.cpp's tokenizer id for id.

The heavy lifting (BPE merging, special-token splitting) is done by the `tokenizers` library;
this module only configures it the way llama.cpp's `llama-vocab.cpp` behaves:

- `gpt2` models: byte-level BPE with the pre-tokenizer regexes llama.cpp picks by
  `tokenizer.ggml.pre` (the table is in `pretokenizers.py`), applied in sequence with every
  match isolated (`unicode_regex_split`).
- `llama` models (SentencePiece): BPE whose merges are derived from the piece scores (the
  transformers LlamaConverter trick, equivalent to llama.cpp's best-score bigram merging), byte
  fallback to `<0xXX>` tokens, spaces escaped as `▁`, and a `▁` prefix on every text fragment
  that starts the input or follows a special token (llama.cpp's `is_prev_special`).
- Control/unknown tokens are split out of the text only with `parse_special`; user-defined tokens
  always are. Two backends are kept so that no shared state is toggled per call (thread safety).

Decoding never goes through `tokenizers`: a per-token byte table reproduces llama.cpp's
`token_to_piece`, so text can also be rebuilt incrementally (see `detokenizer.py`).
"""

from __future__ import annotations

from typing import Any, Iterable

from tokenizers import AddedToken, normalizers
from tokenizers import Tokenizer as _HFTokenizer
from tokenizers.models import BPE

from slotserver.errors import TokenizerError  # noqa: F401  re-export: defined without torch in slotserver.errors
from slotserver.model.text.pretokenizers import PRE_RULES, SUPPORTED_PRE, build_pre_tokenizer

__all__ = ["SUPPORTED_PRE", "Tokenizer", "TokenizerError"]

NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6
_P = "tokenizer.ggml."

# Token texts llama.cpp recognises (llama_vocab::impl::load): EOG by text, EOT/EOM auto-detection
# when the metadata has no id, and the FIM pad / repo / file-separator tokens, which also stop.
_EOG_TEXTS = frozenset({
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<end_of_turn>",
    "<|endoftext|>", "<|eom_id|>", "<EOT>", "_<EOT>", "<|end_of_text|>", "<end_of_utterance>"})
_DETECTED = (
    ("eot_token_id", frozenset({
        "<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>",
        "<|end_of_text|>", "<EOT>", "_<EOT>", "<end_of_utterance>",
        "<｜end▁of▁sentence｜>"})),  # DeepSeek's fullwidth bars
    ("eom_token_id", frozenset({"<|eom_id|>"})),
    ("fim_pad_token_id", frozenset({"<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>"})),
    ("fim_rep_token_id", frozenset({
        "<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"})),
    ("fim_sep_token_id", frozenset({"<|file_sep|>"})),
)


def _byte_level_table() -> dict[int, str]:
    """`str.translate` table undoing GPT-2's `bytes_to_unicode`: each character becomes the
    latin-1 character of its byte. Other characters below 256 become their UTF-8 bytes (as
    latin-1 characters) so the result always encodes with latin-1; see `_byte_level_bytes`."""
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


def _byte_level_bytes(piece: str) -> bytes:
    """Raw bytes of a byte-level BPE piece; characters outside the map pass through as UTF-8."""
    try:
        return piece.translate(_BYTE_LEVEL).encode("latin-1")
    except UnicodeEncodeError:
        return b"".join(ch.translate(_BYTE_LEVEL).encode("latin-1") if ord(ch) in _BYTE_LEVEL
                        else ch.encode() for ch in piece)


def _spm_merges(vocab: dict[str, int], scores: list[float]) -> list[tuple[str, str]]:
    """Merges for a SentencePiece vocab: every split of a piece into two pieces, best score first.

    Merging by this rank equals llama.cpp's rule "merge the adjacent pair whose concatenation is
    the highest-scoring piece" (transformers' SentencePieceExtractor does the same).
    """
    found: list[tuple[float, int, int, int, str, str]] = []
    for piece, pid in vocab.items():
        for cut in range(1, len(piece)):
            left, right = piece[:cut], piece[cut:]
            lid, rid = vocab.get(left), vocab.get(right)
            if lid is not None and rid is not None:
                found.append((-scores[pid], pid, lid, rid, left, right))
    found.sort(key=lambda m: m[:4])
    return [(m[4], m[5]) for m in found]


def _bpe_merges(vocab: dict[str, int], raw: Iterable[str]) -> list[tuple[str, str]]:
    """Parse "a b" merges, dropping those `tokenizers` cannot represent (a part or result OOV)."""
    pairs = (line.split(" ", 1) for line in raw)
    return [(p[0], p[1]) for p in pairs
            if len(p) == 2 and p[0] in vocab and p[1] in vocab and p[0] + p[1] in vocab]


def _meta_id(md: dict[str, Any], key: str, default: int | None, n_vocab: int) -> int | None:
    """A special token id from metadata; out-of-range ids keep the default (llama.cpp warns)."""
    value = md.get(_P + key)
    if value is None or not 0 <= int(value) < n_vocab:
        return default if default is not None and 0 <= default < n_vocab else None
    return int(value)


class Tokenizer:
    """A llama.cpp-compatible tokenizer; build it with `Tokenizer.from_metadata(gguf_kv)`."""

    def __init__(self, md: dict[str, Any]) -> None:
        tokens = md.get(_P + "tokens")
        if not tokens:
            raise TokenizerError("GGUF metadata has no tokenizer.ggml.tokens")
        self._tokens: list[str] = [t or f"[EMPTY_{i}]" for i, t in enumerate(tokens)]
        n = self.vocab_size = len(self._tokens)
        self._types: list[int] = list(md.get(_P + "token_type") or [NORMAL] * n)
        if len(self._types) != n:
            raise TokenizerError(f"token_type has {len(self._types)} entries for {n} tokens")
        self._vocab = {text: i for i, text in enumerate(self._tokens)}
        self.model = str(md.get(_P + "model", ""))
        if self.model == "gpt2":
            self._init_specials(md, None, None, add_bos=self._init_bpe(md))
        elif self.model == "llama":
            self._init_spm(md)
            self._init_specials(md, 1, 2, add_bos=True)  # llama.cpp's SPM defaults
        else:
            raise TokenizerError(f"unsupported tokenizer model {self.model!r} (need gpt2 or llama)")
        self.eog_ids = self._find_eog(md)
        self._hf_plain = self._backend(encode_special_as_text=True)
        self._hf_special = self._backend(encode_special_as_text=False)
        self._build_byte_tables()

    @classmethod
    def from_metadata(cls, md: dict[str, Any]) -> Tokenizer:
        """Build from GGUF key/values given as plain Python values."""
        return cls(md)

    def _init_specials(self, md: dict[str, Any], bos: int | None, eos: int | None,
                       add_bos: bool) -> None:
        """BOS/EOS ids and whether encode(add_special=True) adds them; metadata keys win.

        A default add_bos without any BOS id is dropped; an explicit one is an error.
        """
        self.bos_id = _meta_id(md, "bos_token_id", bos, self.vocab_size)
        self.eos_id = _meta_id(md, "eos_token_id", eos, self.vocab_size)
        self.add_bos = bool(md.get(_P + "add_bos_token", add_bos and self.bos_id is not None))
        self.add_eos = bool(md.get(_P + "add_eos_token", False))
        for name, wanted, tid in (("bos", self.add_bos, self.bos_id),
                                  ("eos", self.add_eos, self.eos_id)):
            if wanted and tid is None:
                raise TokenizerError(f"add_{name}_token is set but the model has no {name} token")

    def _init_bpe(self, md: dict[str, Any]) -> bool:
        """Byte-level BPE; the pre-tokenizer name picks the regexes. Returns llama.cpp's
        add_bos default for that pre-tokenizer."""
        self.pre = str(md.get(_P + "pre") or "default")  # llama.cpp: missing -> 'default'
        if self.pre not in PRE_RULES:
            raise TokenizerError(f"unsupported pre-tokenizer {self.pre!r}; "
                                 f"supported: {', '.join(sorted(PRE_RULES))}")
        regexes, flags = PRE_RULES[self.pre]
        if md.get(_P + "merges") is None:
            raise TokenizerError("gpt2 tokenizer without tokenizer.ggml.merges")
        merges = _bpe_merges(self._vocab, md[_P + "merges"])
        self._model_args = dict(merges=merges, ignore_merges="ignore_merges" in flags)
        self._normalizer: normalizers.Normalizer | None = None
        self._regexes: tuple[str, ...] | None = regexes
        self.add_space_prefix = False
        return "add_bos" in flags

    def _init_spm(self, md: dict[str, Any]) -> None:
        """SentencePiece: score-derived merges, byte fallback, `▁` escaping and prefix."""
        n = self.vocab_size
        scores = list(md.get(_P + "scores") or [0.0] * n)
        if len(scores) != n:
            raise TokenizerError(f"scores has {len(scores)} entries for {n} tokens")
        unk = _meta_id(md, "unknown_token_id", 0, n)
        self._model_args = dict(merges=_spm_merges(self._vocab, scores), byte_fallback=True,
                                unk_token=self._tokens[unk] if unk is not None else None)
        self.pre = "default"
        self.add_space_prefix = bool(md.get(_P + "add_space_prefix", True))
        steps = [normalizers.Prepend("▁")] if self.add_space_prefix else []
        self._normalizer = normalizers.Sequence([*steps, normalizers.Replace(" ", "▁")])
        self._regexes = None

    def _find_eog(self, md: dict[str, Any]) -> frozenset[int]:
        """End-of-generation ids as llama.cpp computes them (by id and by token text).

        Like llama.cpp, a token found by its text is forced to control type, so it is hidden by
        `decode(special=False)` and only split out of text with parse_special.
        """
        n, forced = self.vocab_size, set()
        found: list[int | None] = []
        for key, texts in _DETECTED:
            tid = _meta_id(md, key, None, n)
            if tid is None:  # auto-detect (llama.cpp takes one match; we take the lowest id)
                tid = next((i for i, t in enumerate(self._tokens) if t in texts), None)
                forced.add(tid)
            found.append(tid)
        by_text = {i for i, t in enumerate(self._tokens) if t in _EOG_TEXTS}
        eot, eom, *fim = found
        for i in (forced | by_text) - {None}:
            self._types[i] = CONTROL
        return frozenset({*by_text, *fim, self.eos_id, eot, eom} - {None})

    def _backend(self, encode_special_as_text: bool) -> _HFTokenizer:
        """A `tokenizers` instance; control tokens split out of text unless encoded as text."""
        hf = _HFTokenizer(BPE(self._vocab, **self._model_args))
        if self._normalizer is not None:
            hf.normalizer = self._normalizer
        if self._regexes is not None:
            hf.pre_tokenizer = build_pre_tokenizer(self._regexes)
        hf.add_special_tokens([AddedToken(self._tokens[i], special=True, normalized=False)
                               for i, t in enumerate(self._types) if t in (CONTROL, UNKNOWN)])
        hf.add_tokens([AddedToken(self._tokens[i], special=False, normalized=False)
                       for i, t in enumerate(self._types) if t == USER_DEFINED])
        hf.encode_special_tokens = encode_special_as_text
        return hf

    def _build_byte_tables(self) -> None:
        """Precompute llama.cpp's token_to_piece for every token (special=False and overrides)."""
        spm = self.model == "llama"
        table: list[bytes] = []
        self._special_bytes: dict[int, bytes] = {}
        for i, (text, kind) in enumerate(zip(self._tokens, self._types)):
            if kind in (CONTROL, UNKNOWN):
                self._special_bytes[i] = text.encode()
                table.append(b"")
            elif kind == USER_DEFINED:
                table.append(text.encode())
            elif kind == NORMAL:
                table.append(text.replace("▁", " ").encode() if spm else _byte_level_bytes(text))
            elif kind == BYTE and spm and len(text) == 6 and text.startswith("<0x"):
                table.append(bytes([int(text[3:5], 16)]))
            else:  # unused / undefined tokens render as nothing, like llama.cpp
                table.append(b"")
        self._bytes = table

    def encode(self, text: str, add_special: bool = True, parse_special: bool = False) -> list[int]:
        """Token ids of `text`, like llama-server's /tokenize.

        add_special adds BOS/EOS as the model asks (add_bos/add_eos); parse_special lets
        control-token text such as `<|im_start|>` become that token instead of plain text.
        """
        if not isinstance(text, str):
            raise TokenizerError(f"encode expects str, got {type(text).__name__}")
        ids: list[int] = []
        if add_special and self.add_bos:
            ids.append(self.bos_id)  # type: ignore[arg-type]
        if text:
            backend = self._hf_special if parse_special else self._hf_plain
            try:
                ids.extend(backend.encode(text, add_special_tokens=False).ids)
            except Exception as exc:  # e.g. lone surrogates in the input
                raise TokenizerError(f"cannot tokenize text: {exc}") from exc
        if add_special and self.add_eos:
            ids.append(self.eos_id)  # type: ignore[arg-type]
        return ids

    def token_bytes(self, id: int, special: bool = False) -> bytes:
        """Raw bytes of one token's piece (may be part of a UTF-8 character)."""
        if not 0 <= id < self.vocab_size:
            raise TokenizerError(f"token id {id} out of range [0, {self.vocab_size})")
        if special and id in self._special_bytes:
            return self._special_bytes[id]
        return self._bytes[id]

    def decode(self, ids: Iterable[int], special: bool = False) -> str:
        """Concatenated pieces as text; invalid UTF-8 becomes U+FFFD.

        special=False hides control/unknown tokens, as llama.cpp's token_to_piece does.
        """
        return b"".join(self.token_bytes(i, special) for i in ids).decode("utf-8", "replace")

    def piece(self, id: int) -> str:
        """The vocabulary string of a token (byte-level or `▁`-escaped form)."""
        if not 0 <= id < self.vocab_size:
            raise TokenizerError(f"token id {id} out of range [0, {self.vocab_size})")
        return self._tokens[id]

    def token_to_id(self, text: str) -> int | None:
        """Id of the vocabulary string `text`, or None."""
        return self._vocab.get(text)
