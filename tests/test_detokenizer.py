"""Streaming detokenization never shows half a character and adds up to the full text."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slotserver.model.text.detokenizer import IncrementalDetokenizer, detokenize
from slotserver.model.text.tokenizer import Tokenizer

# ASCII, accents, Greek/Cyrillic, CJK, emoji (4-byte UTF-8) and whitespace; no surrogates.
_ALPHABET = st.one_of(
    st.characters(min_codepoint=0x20, max_codepoint=0x7E),
    st.sampled_from("\n\t éüßñ"),
    st.characters(min_codepoint=0x391, max_codepoint=0x44F),
    st.characters(min_codepoint=0x4E00, max_codepoint=0x9FFF),
    st.characters(min_codepoint=0x1F300, max_codepoint=0x1FAFF),
)


@pytest.fixture(scope="module")
def smollm(smollm_metadata) -> Tokenizer:
    return Tokenizer.from_metadata(smollm_metadata)


def _id_with_bytes(tok: Tokenizer, data: bytes) -> int:
    return next(i for i in range(tok.vocab_size) if tok.token_bytes(i) == data)


@settings(max_examples=150, deadline=None)
@given(text=st.text(_ALPHABET, max_size=40))
def test_streamed_chunks_are_whole_characters_adding_up_to_the_text(smollm, text):
    detok = IncrementalDetokenizer(smollm)
    chunks = [detok.push(i) for i in smollm.encode(text, add_special=False)]
    for chunk in chunks:
        chunk.encode("utf-8")  # no lone surrogates
        assert "\ufffd" not in chunk  # never a replacement char for valid text
    assert detok.flush() == ""
    assert "".join(chunks) == text == detok.text


@settings(max_examples=100, deadline=None)
@given(ids=st.lists(st.integers(min_value=0, max_value=49151), max_size=12))
def test_any_token_sequence_streams_to_the_same_text_as_decode(smollm, ids):
    detok = IncrementalDetokenizer(smollm)
    streamed = "".join(detok.push(i) for i in ids) + detok.flush()
    assert streamed == smollm.decode(ids) == detok.text


def test_emoji_split_across_tokens_appears_only_when_complete(smollm):
    ids = smollm.encode("a🚀", add_special=False)
    assert len(ids) >= 3  # 'a' plus the 4 bytes of the emoji over several tokens
    detok = IncrementalDetokenizer(smollm)
    assert detok.push(ids[0]) == "a"
    for token_id in ids[1:-1]:
        assert detok.push(token_id) == ""
        assert detok.pending
    assert detok.push(ids[-1]) == "🚀"
    assert not detok.pending and detok.text == "a🚀"


def test_impossible_bytes_become_replacement_chars_as_soon_as_certain(smollm):
    lone_continuation = _id_with_bytes(smollm, b"\x80")
    lead_of_four = _id_with_bytes(smollm, b"\xf0")
    detok = IncrementalDetokenizer(smollm)
    assert detok.push(lone_continuation) == "\ufffd"  # can never start a character
    assert detok.push(lead_of_four) == ""  # might still complete
    assert detok.push(smollm.encode("x", add_special=False)[0]) == "\ufffdx"  # now it cannot


def test_flush_replaces_an_unfinished_character(smollm):
    detok = IncrementalDetokenizer(smollm)
    detok.push(_id_with_bytes(smollm, b"\xf0"))
    assert detok.flush() == "\ufffd"
    assert detok.flush() == ""


def test_control_tokens_render_only_with_special(smollm):
    ids = smollm.encode("<|im_start|>hi<|im_end|>", add_special=False, parse_special=True)
    assert IncrementalDetokenizer(smollm).extend(ids) == "hi"
    assert IncrementalDetokenizer(smollm, special=True).extend(ids) == "<|im_start|>hi<|im_end|>"


# --- llama_detokenize (the "prompt" text llama-server reports) -----------------------------


def _byte_level(pre: str) -> Tokenizer:
    """A byte-level vocabulary of single characters only: every piece is one character."""
    from tokenizers import pre_tokenizers

    tokens = ["<|endoftext|>", *sorted(pre_tokenizers.ByteLevel.alphabet())]
    return Tokenizer.from_metadata({
        "tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": pre, "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": [3] + [1] * (len(tokens) - 1), "tokenizer.ggml.merges": [],
        "tokenizer.ggml.eos_token_id": 0, "tokenizer.ggml.bos_token_id": 0})


def test_clean_spaces_follows_llama_cpp_three_passes():
    """gpt-2 style models clean " ," " !" (pass 1), " ' " (pass 2, in place: "a ' b ' c" ->
    "a'b'c") and " 's" " 'm" " 're" " 've" but not " 't" " 'd" " 'll" (pass 3)."""
    tok = _byte_level("gpt-2")
    assert tok.clean_spaces
    text = "Hello , world ! it 's a ' b ' c 't I 'm we 're 've 'd 'll ."
    ids = tok.encode(text, add_special=False)
    assert decode_all(tok, ids) == text  # /detokenize and streaming keep every space
    assert detokenize(tok, ids) == "Hello, world! it's a'b'c 't I'm we're've 'd 'll."


def test_models_that_keep_spaces_are_not_cleaned(smollm):
    text = "Hello , world ! it 's"
    assert not smollm.clean_spaces
    assert detokenize(smollm, smollm.encode(text, add_special=False)) == text


def test_remove_special_drops_added_bos_and_eos_only():
    tok = _byte_level("llama-bpe")  # llama 3 style: adds BOS by default
    ids = tok.encode("hi")
    assert ids[0] == tok.bos_id and tok.add_bos
    assert detokenize(tok, ids, unparse_special=True) == "<|endoftext|>hi"
    assert detokenize(tok, ids, remove_special=True, unparse_special=True) == "hi"
    assert detokenize(tok, [*ids, 0], remove_special=True, unparse_special=True) == \
        "hi<|endoftext|>"  # EOS is kept: this model does not add it


def decode_all(tok: Tokenizer, ids: list[int]) -> str:
    return IncrementalDetokenizer(tok).extend(ids)
