"""Real vocabularies (gemma3's 262k SentencePiece, llama 2, phi-3, qwen2, and qwen2's under MiniCPM5's
pre-tokenizer) against llama.cpp's ids.

The expected ids come from `llama-tokenize` on the same vocab-only files (see
tests/tokenizer_fixtures.py); both ways of tokenizing that llama-server offers are checked:
with the model's BOS and special-token text kept as text, and with special tokens parsed.
"""

from __future__ import annotations

import pytest

from slotserver.model.text.detokenizer import IncrementalDetokenizer, detokenize
from slotserver.model.text.special_tokens import CONTROL, USER_DEFINED
from tokenizer_fixtures import NAMES, metadata, rows, tokenizer

_SPECIAL_MARKS = ("<", "[multimodal]")  # rows whose text may hold special-token text


@pytest.mark.parametrize("name", NAMES)
def test_every_row_matches_llama_tokenize(name):
    tok = tokenizer(name)
    assert len(rows(name)) >= 90
    for row in rows(name):
        assert tok.encode(row["text"]) == row["ids"], (name, row["text"])
        assert tok.encode(row["text"], add_special=False, parse_special=True) == \
            row["ids_parse_special"], (name, row["text"])


@pytest.mark.parametrize("name", [n for n in NAMES if n != "minicpm5"])   # (its clean_spaces drops " ?"'s space)
def test_detokenize_gives_the_text_back(name):
    """llama_detokenize of the ids is the text (SentencePiece's prefix space removed), for text
    without special-token markup (phi-3 strips spaces after its specials, by design). A literal
    `▁` in SentencePiece input comes back as a space, as in llama.cpp."""
    tok = tokenizer(name)
    for row in rows(name):
        text = row["text"]
        if any(mark in text for mark in _SPECIAL_MARKS):
            continue
        if tok.model == "llama" and "▁" in text:
            assert detokenize(tok, row["ids_parse_special"]) == text.replace("▁", " ")
            continue
        ids = row["ids_parse_special"]
        assert detokenize(tok, ids, unparse_special=True) == text, (name, text)
        assert detokenize(tok, row["ids"], remove_special=True) == \
            (" " + text if tok.add_bos and tok.add_space_prefix and text else text), (name, text)


def test_gemma3_special_tokens_as_llama_cpp_sets_them():
    tok = tokenizer("gemma3")
    assert tok.vocab_size == 262144 and tok.model == "llama"
    assert (tok.bos_id, tok.eos_id, tok.add_bos, tok.add_eos) == (2, 1, True, False)
    assert tok.add_space_prefix is False
    ids = {text: tok.token_to_id(text) for text in ("<eos>", "<end_of_turn>", "</s>", "<bos>")}
    assert {ids["<eos>"], ids["<end_of_turn>"], ids["</s>"]} <= tok.eog_ids
    assert ids["<bos>"] not in tok.eog_ids and tok.token_to_id("<start_of_turn>") not in tok.eog_ids
    # "</s>" is a user-defined HTML tag in gemma's vocabulary, but llama.cpp's EOG list makes it
    # control: it is then text unless parse_special, and hidden when decoding without special
    assert tok.token_type(ids["</s>"]) == CONTROL
    assert tok.token_type(tok.token_to_id("<b>")) == USER_DEFINED
    assert tok.decode([ids["</s>"]]) == "" and tok.decode([ids["</s>"]], special=True) == "</s>"


def test_gemma3_prompt_with_chat_markup():
    tok = tokenizer("gemma3")
    prompt = "<start_of_turn>user\nWhy is the sky blue?<end_of_turn>\n<start_of_turn>model\n"
    ids = tok.encode(prompt, parse_special=True)
    assert ids[:2] == [2, tok.token_to_id("<start_of_turn>")]
    assert tok.decode(ids, special=True) == "<bos>" + prompt
    assert tok.decode(ids) == prompt.replace("<start_of_turn>", "").replace("<end_of_turn>", "")


def test_gemma3_byte_fallback_streams_whole_characters():
    """A character outside the vocabulary becomes <0xXX> byte tokens; streaming holds the
    partial bytes back until the character is complete."""
    tok = tokenizer("gemma3")
    text = "ᐊ🦙ᐃ"
    ids = tok.encode(text, add_special=False)
    assert any(tok.piece(i).startswith("<0x") for i in ids)
    detok = IncrementalDetokenizer(tok)
    chunks = [detok.push(i) for i in ids]
    assert "".join(chunks) == text and all("\ufffd" not in c for c in chunks)
    assert "" in chunks  # at least one byte token completed nothing on its own


def test_llama2_prefix_space_follows_special_tokens():
    """llama 2 prefixes every text fragment that starts the input or follows a special token
    with a space (add_space_prefix), so `<s>Hi` and `Hi` both give `▁Hi`."""
    tok = tokenizer("llama-spm")
    assert tok.add_space_prefix and tok.add_bos and tok.bos_id == 1
    plain = tok.encode("Hi", add_special=False)
    assert tok.encode("<s>Hi", add_special=False, parse_special=True) == [1, *plain]
    assert tok.piece(plain[0]).startswith("▁")
    assert detokenize(tok, plain) == "Hi" and tok.decode(plain) == " Hi"


def test_phi3_special_tokens_swallow_following_whitespace():
    """llama.cpp marks phi-3's special tokens rstrip (found by general.name)."""
    assert "phi3" in metadata("phi-3")["general.name"].lower()
    tok = tokenizer("phi-3")
    end = tok.token_to_id("<|end|>")
    a = tok.encode("x<|end|>\n\n  y", add_special=False, parse_special=True)
    b = tok.encode("x<|end|>y", add_special=False, parse_special=True)
    assert end in a and a == b


def test_qwen2_splits_digits_and_keeps_chatml_special():
    tok = tokenizer("qwen2")
    assert tok.pre == "qwen2" and not tok.add_bos and tok.clean_spaces is False
    assert len(tok.encode("12345", add_special=False)) == 5  # \p{N}: one digit per token
    im_start = tok.token_to_id("<|im_start|>")
    assert tok.encode("<|im_start|>", add_special=False, parse_special=True) == [im_start]
    assert im_start not in tok.encode("<|im_start|>", add_special=False)
    assert {tok.token_to_id("<|im_end|>"), tok.token_to_id("<|endoftext|>")} <= tok.eog_ids
