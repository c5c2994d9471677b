"""llama.cpp's load-time corrections of special tokens (special_tokens.py), on small vocabularies.

A GGUF's token types are not the last word: llama.cpp recognises end-of-generation and FIM tokens
by their text, makes them control tokens (so their text stays text unless parse_special) and
stops generation on them; a few vocabularies get per-token fixes.
"""

from __future__ import annotations

from tokenizers import pre_tokenizers

from slotserver.model.text.special_tokens import CONTROL, NORMAL, USER_DEFINED
from slotserver.model.text.tokenizer import Tokenizer

_ALPHABET = sorted(pre_tokenizers.ByteLevel.alphabet())


def _vocab(extra: dict[str, int], **md) -> Tokenizer:
    """Byte-level alphabet + `extra` tokens with the given GGUF types."""
    tokens = [*_ALPHABET, *extra]
    return Tokenizer.from_metadata({
        "tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "qwen2",
        "tokenizer.ggml.tokens": tokens, "tokenizer.ggml.merges": [],
        "tokenizer.ggml.token_type": [NORMAL] * len(_ALPHABET) + list(extra.values()), **md})


def test_eog_and_fim_tokens_typed_normal_become_control():
    tok = _vocab({"<|im_end|>": NORMAL, "<|fim_prefix|>": USER_DEFINED, "<|fim_pad|>": NORMAL,
                  "<tool>": USER_DEFINED}, **{"tokenizer.ggml.eos_token_id": len(_ALPHABET)})
    im_end, fim_pre, fim_pad, tool = (tok.token_to_id(t) for t in
                                      ("<|im_end|>", "<|fim_prefix|>", "<|fim_pad|>", "<tool>"))
    assert tok.token_type(im_end) == tok.token_type(fim_pre) == CONTROL
    assert tok.token_type(tool) == USER_DEFINED
    assert tok.eog_ids == {im_end, fim_pad}  # FIM pad/repo/sep stop generation, prefix does not
    text = "a<|im_end|><|fim_prefix|><tool>"
    assert im_end not in tok.encode(text) and fim_pre not in tok.encode(text)
    assert tok.encode(text, parse_special=True)[1:] == [im_end, fim_pre, tool]
    assert tok.encode(text)[-1] == tool  # user-defined tokens always split out


def test_metadata_ids_win_over_detection_and_default_ids_are_llama_cpp_s():
    tok = _vocab({"<|endoftext|>": CONTROL, "<|im_end|>": CONTROL},
                 **{"tokenizer.ggml.eot_token_id": 1})
    assert tok.special_ids["eot_token_id"] == 1
    # byte-level vocabularies default BOS and EOS to id 11, as llama.cpp does
    assert tok.bos_id == tok.eos_id == 11 and 11 in tok.eog_ids


def test_harmony_end_is_shown_text_when_return_and_call_exist():
    tok = _vocab({"<|end|>": CONTROL, "<|return|>": CONTROL, "<|call|>": CONTROL,
                  "<|channel|>": CONTROL})
    end, channel = tok.token_to_id("<|end|>"), tok.token_to_id("<|channel|>")
    assert end not in tok.eog_ids and tok.token_type(end) == USER_DEFINED
    assert tok.token_to_id("<|return|>") in tok.eog_ids
    assert tok.decode([end, channel]) == "<|end|><|channel|>"  # shown without special=True
