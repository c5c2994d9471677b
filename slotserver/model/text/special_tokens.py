"""Special tokens as llama.cpp decides them when it loads a vocabulary (`llama_vocab::impl::load`).

A GGUF file names some special ids (bos, eos, eot, ...) and gives each token a type, but llama.cpp
then corrects the file by token text: end-of-generation (EOG) tokens are recognised by name, tokens
it recognises (EOG, EOT, FIM) are forced to control type, a few tokens are re-typed for specific
tokenizers, and Phi-3's special tokens swallow the whitespace after them (`rstrip`). Those
corrections change both tokenization and detokenization, so they are reproduced here, as they are in
the llama.cpp version the project is checked against (see tests/fixtures/tokenizers/).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["NORMAL", "UNKNOWN", "CONTROL", "USER_DEFINED", "UNUSED", "BYTE", "SpecialTokens",
           "find_special_tokens"]

NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6
_P = "tokenizer.ggml."

# Tokens whose text makes them stop generation (llama.cpp's EOG list).
_EOG_TEXTS = frozenset({
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
    "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]",
    "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
    "<｜end▁of▁sentence｜>", "[e~["})
# Special ids llama.cpp finds by text when the metadata has none; a found token becomes control.
_DETECTED = (
    ("eot_token_id", frozenset({
        "<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>",
        "<|end_of_text|>", "<EOT>", "_<EOT>", "[EOT]", "<｜end▁of▁sentence｜>",
        "<end_of_utterance>"})),
    ("eom_token_id", frozenset({"<|eom_id|>"})),
    ("fim_pre_token_id", frozenset({
        "<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<｜fim▁begin｜>", "<PRE>", "▁<PRE>",
        "<|code_prefix|>", "<|prefix|>"})),
    ("fim_suf_token_id", frozenset({
        "<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<｜fim▁hole｜>", "<SUF>", "▁<SUF>",
        "<|code_suffix|>", "<|suffix|>"})),
    ("fim_mid_token_id", frozenset({
        "<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<｜fim▁end｜>", "<MID>", "▁<MID>",
        "<|code_middle|>", "<|middle|>"})),
    ("fim_pad_token_id", frozenset({"<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"})),
    ("fim_rep_token_id", frozenset({
        "<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"})),
    ("fim_sep_token_id", frozenset({"<|file_sep|>"})),
)
_STOPPING_FIM = ("fim_pad_token_id", "fim_rep_token_id", "fim_sep_token_id")
_ALWAYS_SHOWN = ("<|channel|>", "<|message|>", "<|start|>", "<|constrain|>")  # gpt-oss


@dataclass
class SpecialTokens:
    """What llama.cpp derives from the metadata: ids, corrected types, EOG set, strip flags."""

    types: list[int]
    bos_id: int | None = None
    eos_id: int | None = None
    ids: dict[str, int] = field(default_factory=dict)  # eot/eom/fim ids by metadata key
    eog_ids: frozenset[int] = frozenset()
    rstrip: frozenset[int] = frozenset()  # special tokens that eat the whitespace after them


def meta_id(md: dict[str, Any], key: str, default: int | None, n_vocab: int) -> int | None:
    """A special id from metadata; an out-of-range id keeps the default (llama.cpp warns)."""
    value = md.get(_P + key)
    if value is None or not 0 <= int(value) < n_vocab:
        return default if default is not None and 0 <= default < n_vocab else None
    return int(value)


def find_special_tokens(md: dict[str, Any], tokens: list[str], vocab: dict[str, int],
                        types: list[int], bos: int | None, eos: int | None) -> SpecialTokens:
    """Apply llama.cpp's load-time rules; `bos`/`eos` are the tokenizer model's default ids."""
    n = len(tokens)
    st = SpecialTokens(types=list(types), bos_id=meta_id(md, "bos_token_id", bos, n),
                       eos_id=meta_id(md, "eos_token_id", eos, n))
    for key, texts in _DETECTED:
        tid = meta_id(md, key, None, n)
        if tid is None:  # llama.cpp takes whichever match its hash map yields; we take the lowest
            tid = min((vocab[t] for t in texts if t in vocab), default=None)
            _force_control(st.types, tid)
        if tid is not None:
            st.ids[key] = tid
    by_text = {vocab[t] for t in _EOG_TEXTS if t in vocab}
    for tid in by_text:
        _force_control(st.types, tid)
    for text in _ALWAYS_SHOWN:
        if text in vocab:
            st.types[vocab[text]] = USER_DEFINED
    eog = by_text | {st.ids[k] for k in _STOPPING_FIM if k in st.ids}
    eog |= {i for i in (st.eos_id, st.ids.get("eot_token_id"), st.ids.get("eom_token_id"))
            if i is not None}
    st.eog_ids = frozenset(_harmony_and_gemma4_fixes(eog, tokens, st.types))
    st.rstrip = _rstrip_tokens(md, vocab, st.types)
    return st


def _force_control(types: list[int], tid: int | None) -> None:
    """llama.cpp ORs the control attribute in; a control-typed token behaves as CONTROL."""
    if tid is not None and types[tid] not in (CONTROL, UNKNOWN):
        types[tid] = CONTROL


def _harmony_and_gemma4_fixes(eog: set[int], tokens: list[str], types: list[int]) -> set[int]:
    """o200k_harmony/solar-open: `<|end|>` is not EOG but shown text; gemma4/plamo: `</s>` is
    a normal token (llama.cpp's two post-hoc corrections of its EOG list)."""
    texts = {tokens[i]: i for i in eog}
    if "<|end|>" in texts and (("<|return|>" in texts and "<|call|>" in texts)
                               or ("<|calls|>" in texts and "<|flush|>" in texts)):
        eog.discard(texts["<|end|>"])
        types[texts["<|end|>"]] = USER_DEFINED
    if "</s>" in texts and ("<|tool_response>" in texts or "<|plamo:eos|>" in texts):
        eog.discard(texts["</s>"])
        types[texts["</s>"]] = NORMAL
    return eog


def _rstrip_tokens(md: dict[str, Any], vocab: dict[str, int], types: list[int]) -> frozenset[int]:
    """Phi-3 (by `general.name`): every special token except <unk>, <s>, <|endoftext|> strips
    the whitespace that follows it in the text (llama.cpp's LLAMA_TOKEN_ATTR_RSTRIP)."""
    name = str(md.get("general.name", "")).lower()
    if "phi-3" not in name and "phi3" not in name:
        return frozenset()
    ids = {i for i, t in enumerate(types) if t in (CONTROL, USER_DEFINED, UNKNOWN)}
    if "</s>" in vocab:
        ids.add(vocab["</s>"])
    return frozenset(ids - {vocab[t] for t in ("<unk>", "<s>", "<|endoftext|>") if t in vocab})
