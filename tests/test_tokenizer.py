"""The tokenizer must produce exactly llama.cpp's token ids and text."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from tokenizers import pre_tokenizers

from slotserver.model.text.tokenizer import SUPPORTED_PRE, Tokenizer, TokenizerError, _bpe_merges


@pytest.fixture(scope="module")
def smollm(smollm_metadata) -> Tokenizer:
    return Tokenizer.from_metadata(smollm_metadata)


# --- the default model against llama-server's own /tokenize and /detokenize -----------------


def test_every_fixture_row_matches_llama_cpp(smollm, tokenize_fixture):
    assert len(tokenize_fixture) == 43
    for row in tokenize_fixture:
        text = row["text"]
        assert smollm.encode(text, add_special=False, parse_special=False) == row["ids"], text
        assert smollm.encode(text, add_special=False, parse_special=True) == \
            row["ids_parse_special"], text
        assert smollm.decode(row["ids"]) == row["detok"] == text


def test_special_token_text_is_plain_text_unless_parse_special(smollm):
    prompt = "<|im_start|>user\nHi<|im_end|>\n"
    plain = smollm.encode(prompt, add_special=False)
    parsed = smollm.encode(prompt, add_special=False, parse_special=True)
    assert 1 not in plain and 2 not in plain
    assert parsed[0] == 1 and 2 in parsed
    # the newline right after the special token is kept, not stripped
    assert smollm.decode(parsed, special=True) == prompt
    assert smollm.decode(parsed) == "user\nHi\n"  # control tokens hidden by default


def test_default_model_special_ids(smollm):
    assert smollm.vocab_size == 49152
    assert smollm.bos_id == 1 and smollm.eos_id == 2
    assert smollm.add_bos is False and smollm.add_eos is False
    assert smollm.encode("Hello world!") == [19556, 905, 17]  # add_special adds nothing here
    assert {0, 2} <= smollm.eog_ids  # <|endoftext|>, <|im_end|>
    assert 1 not in smollm.eog_ids  # <|im_start|> does not stop generation
    assert smollm.piece(2) == "<|im_end|>" and smollm.token_to_id("<|im_end|>") == 2
    assert smollm.token_to_id("no such token") is None


def test_token_bytes_can_split_a_character(smollm):
    ids = smollm.encode("🚀", add_special=False)
    assert len(ids) > 1  # byte-level BPE splits the emoji
    assert b"".join(smollm.token_bytes(i) for i in ids) == "🚀".encode()
    assert smollm.token_bytes(2) == b"" and smollm.token_bytes(2, special=True) == b"<|im_end|>"


def test_concurrent_encodes_with_and_without_parse_special_do_not_interfere(smollm):
    prompt = "<|im_start|>user\nHi<|im_end|>\n" * 20
    expected = {flag: smollm.encode(prompt, parse_special=flag) for flag in (False, True)}
    flags = [i % 2 == 0 for i in range(200)]
    with ThreadPoolExecutor(max_workers=8) as pool:
        results = list(pool.map(lambda flag: smollm.encode(prompt, parse_special=flag), flags))
    assert all(got == expected[flag] for got, flag in zip(results, flags))


def test_out_of_range_ids_are_rejected(smollm):
    with pytest.raises(TokenizerError):
        smollm.decode([smollm.vocab_size])
    with pytest.raises(TokenizerError):
        smollm.token_bytes(-1)


def test_construction_is_fast(smollm_metadata):
    start = time.perf_counter()
    Tokenizer.from_metadata(smollm_metadata)
    assert time.perf_counter() - start < 1.5


# --- pre-tokenizer choice on a small byte-level vocab ---------------------------------------

_ALPHABET = sorted(pre_tokenizers.ByteLevel.alphabet())
_MERGES = ["1 2", "12 3", "4 5", "123 45", "Ġ 2", "Ġ2 0", "Ġ20 2", "Ġ202 4"]


def _bpe_metadata(pre: str | None, extra_tokens: tuple[str, ...] = ()) -> dict:
    merged = [m.replace(" ", "") for m in _MERGES]
    tokens = ["<|endoftext|>", *_ALPHABET, *merged, *extra_tokens]
    md = {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": [3] + [1] * (len(tokens) - 1),
        "tokenizer.ggml.merges": _MERGES,
        "tokenizer.ggml.eos_token_id": 0,
    }
    if pre is not None:
        md["tokenizer.ggml.pre"] = pre
    return md


def _pieces(pre: str | None, text: str, extra_tokens: tuple[str, ...] = ()) -> list[str]:
    tok = Tokenizer.from_metadata(_bpe_metadata(pre, extra_tokens))
    return [tok.piece(i) for i in tok.encode(text, add_special=False)]


@pytest.mark.parametrize(("pre", "expected"), [
    ("gpt-2", ["12345"]),  # ` ?\p{N}+`: one run of digits
    ("gpt2", ["12345"]),
    ("llama3", ["123", "45"]),  # `\p{N}{1,3}`
    ("llama-bpe", ["123", "45"]),
    ("qwen2", ["1", "2", "3", "4", "5"]),  # `\p{N}`: each digit alone
    ("smollm", ["1", "2", "3", "4", "5"]),
    ("starcoder", ["1", "2", "3", "4", "5"]),
    ("default", ["123", "45"]),  # llama.cpp's fallback set ends with [0-9][0-9][0-9]
    (None, ["123", "45"]),  # no pre-tokenizer in the file means 'default'
])
def test_digit_grouping_follows_the_pre_tokenizer(pre, expected):
    assert _pieces(pre, "12345") == expected


def test_space_before_a_number_depends_on_the_pre_tokenizer():
    assert _pieces("gpt-2", "in 2024") == ["i", "n", "Ġ2024"]
    assert _pieces("llama3", "in 2024") == ["i", "n", "Ġ", "2", "0", "2", "4"]


def test_llama3_uses_whole_words_from_the_vocab_before_merges():
    """llama.cpp's ignore_merges: a pre-token that is a vocab entry is taken as is."""
    assert _pieces("llama3", "hello", extra_tokens=("hello",)) == ["hello"]
    assert _pieces("gpt-2", "hello", extra_tokens=("hello",)) == list("hello")


def test_llama3_adds_bos_by_default():
    md = _bpe_metadata("llama3") | {"tokenizer.ggml.bos_token_id": 0}
    assert Tokenizer.from_metadata(md).encode("1")[0] == 0


def test_unknown_pre_tokenizer_is_an_error():
    with pytest.raises(TokenizerError, match="unsupported pre-tokenizer 'nonsense-bpe'"):
        Tokenizer.from_metadata(_bpe_metadata("nonsense-bpe"))
    assert {"smollm", "llama3", "qwen2", "gpt-2", "default"} <= SUPPORTED_PRE


def test_unknown_tokenizer_model_is_an_error():
    with pytest.raises(TokenizerError, match="unsupported tokenizer model"):
        Tokenizer.from_metadata(_bpe_metadata("gpt-2") | {"tokenizer.ggml.model": "rwkv"})   # bert, t5: their own files


# --- SentencePiece ---------------------------------------------------------------------------

_SPM_PIECES = {  # piece -> score; a higher score merges first
    "▁": -1.0, "h": -2.0, "e": -3.0, "l": -4.0, "o": -5.0, "w": -6.0, "r": -7.0, "d": -8.0,
    "he": -9.0, "ll": -10.0, "llo": -11.0, "▁he": -12.0, "▁hello": -13.0, "▁w": -14.0,
    "or": -15.0, "ld": -16.0, "<X>": 0.0,
}


@pytest.fixture(scope="module")
def spm() -> Tokenizer:
    tokens = ["<unk>", "<s>", "</s>", *(f"<0x{b:02X}>" for b in range(256)), *_SPM_PIECES]
    types = [2, 3, 3, *[6] * 256, *[1] * (len(_SPM_PIECES) - 1), 4]  # <X> is user-defined
    scores = [0.0] * 259 + list(_SPM_PIECES.values())
    return Tokenizer.from_metadata({
        "tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": types, "tokenizer.ggml.scores": scores,
        "tokenizer.ggml.bos_token_id": 1, "tokenizer.ggml.eos_token_id": 2,
    })


def _spm_pieces(tok: Tokenizer, ids: list[int]) -> list[str]:
    return [tok.piece(i) for i in ids]


def test_spm_merges_by_score_with_space_prefix_and_bos(spm):
    ids = spm.encode("hello world")
    assert _spm_pieces(spm, ids) == ["<s>", "▁hello", "▁w", "or", "ld"]
    assert spm.add_bos and spm.eog_ids == {2}


def test_spm_unknown_characters_fall_back_to_bytes(spm):
    ids = spm.encode("hello ü", add_special=False)
    assert _spm_pieces(spm, ids) == ["▁hello", "▁", "<0xC3>", "<0xBC>"]


def test_spm_decode_round_trip_keeps_the_prefix_space(spm):
    """Like llama-server's /detokenize (per-token pieces), the `▁` prefix decodes to a space."""
    for text in ["hello world", "hello ü wor", "  hello\n"]:
        assert spm.decode(spm.encode(text)) == " " + text


def test_spm_user_defined_tokens_always_split_and_restart_the_prefix(spm):
    """After a special token llama.cpp prefixes the next text fragment with a space again."""
    ids = spm.encode("hello<X>hello", add_special=False)
    assert _spm_pieces(spm, ids) == ["▁hello", "<X>", "▁hello"]
    assert _spm_pieces(spm, spm.encode("<s>hello", add_special=False, parse_special=True)) == \
        ["<s>", "▁hello"]
    assert "<s>" not in _spm_pieces(spm, spm.encode("<s>hello", add_special=False))


@pytest.mark.parametrize("merges", [
    ["a b", "ab c", "d e"],                # the common case: every merge "x y", all in the vocabulary
    ["a b", "ab", "c d e", "x y"],         # no space, two spaces, unknown parts: dropped
    ["ab", "c d e"],                       # one merge short of a space, one over: not paired across lines
])
def test_bpe_merges_keep_exactly_the_representable_pairs(merges):
    """A vocabulary's merges are parsed at C speed (151k of them took 0.17 s per merge in Python);
    what is kept is what the per-merge rule keeps, whatever lines a file holds."""
    vocab = {t: i for i, t in enumerate(["a", "b", "ab", "c", "abc", "d", "e", "de"])}
    rule = [(p[0], p[1]) for p in (m.split(" ", 1) for m in merges)
            if len(p) == 2 and p[0] in vocab and p[1] in vocab and p[0] + p[1] in vocab]
    assert _bpe_merges(vocab, merges) == rule


@pytest.mark.parametrize("extra", [(), ("ĀāĂă", "xĀāĂăy")])
def test_byte_level_token_bytes_include_the_zero_byte_and_separator_like_pieces(extra):
    """Token bytes of a byte-level vocabulary: "Ā" is byte 00 (every GPT-2-style vocabulary has it),
    a raw character passes through as UTF-8, and pieces holding the bytes 00 01 02 03 (what the
    table builder joins pieces with) still get their own bytes."""
    tokens = ("Ā", "ĠhĀ", "Ċ", "中", *extra)
    tok = Tokenizer.from_metadata(_bpe_metadata("gpt-2", tokens))
    want = {"Ā": b"\x00", "ĠhĀ": b" h\x00", "Ċ": b"\n", "中": "中".encode(), "ĀāĂă": b"\x00\x01\x02\x03",
            "xĀāĂăy": b"x\x00\x01\x02\x03y"}
    for t in tokens:
        assert tok.token_bytes(tok.token_to_id(t)) == want[t]
    assert tok.token_bytes(tok.token_to_id("a")) == b"a"
