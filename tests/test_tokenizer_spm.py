"""SentencePiece vocabularies: score-ranked BPE merges equal llama.cpp's bigram-merge tokenizer.

`_llama_spm` below is a line-by-line port of llama.cpp's `llm_tokenizer_spm_session::tokenize`
(highest-scoring adjacent pair first, leftmost on ties, unknown characters as byte tokens); the
`tokenizers`-based Tokenizer must give the same ids on any text over a vocabulary whose pieces
overlap in every way (every piece reachable by several cuts).
"""

from __future__ import annotations

import functools
import heapq
import random
import time

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from slotserver.model.text.spm_merges import spm_merges, spm_merges_reference
from slotserver.model.text.tokenizer import Tokenizer
from tokenizer_fixtures import metadata, tokenizer


def _llama_spm(text: str, vocab: dict[str, int], scores: list[float]) -> list[int]:
    """llama.cpp's SPM session on one fragment that is already `▁`-escaped."""
    sym = list(text)
    alive = [True] * len(sym)
    nxt = list(range(1, len(sym))) + [-1]
    prv = list(range(-1, len(sym) - 1))
    queue: list[tuple[float, int, int, int]] = []

    def add(left: int, right: int) -> None:
        if left >= 0 and right >= 0 and sym[left] + sym[right] in vocab:
            joined = sym[left] + sym[right]
            heapq.heappush(queue, (-scores[vocab[joined]], left, right, len(joined)))

    for i in range(1, len(sym)):
        add(i - 1, i)
    while queue:
        _, left, right, size = heapq.heappop(queue)
        if not (alive[left] and alive[right]) or len(sym[left]) + len(sym[right]) != size:
            continue
        sym[left] += sym[right]
        alive[right] = False
        nxt[left] = nxt[right]
        if nxt[right] >= 0:
            prv[nxt[right]] = left
        add(prv[left], left)
        add(left, nxt[left])
    out: list[int] = []
    i = 0 if sym else -1
    while i != -1:
        piece = sym[i]
        out += [vocab[piece]] if piece in vocab else \
            [vocab[f"<0x{b:02X}>"] for b in piece.encode()]
        i = nxt[i]
    return out


def _synthetic_vocab(seed: int) -> tuple[dict, dict[str, int], list[float]]:
    """Pieces over a 4-letter alphabet + `▁`, all pieces of length <= 3 and random longer ones,
    random distinct scores: merges interact and compete in every way."""
    rng = random.Random(seed)
    letters = "ab▁c"
    pieces = set(letters)
    pieces |= {x + y for x in letters for y in letters}
    pieces |= {x + y + z for x in letters for y in letters for z in letters if rng.random() < .6}
    pieces |= {"".join(rng.choice(letters) for _ in range(rng.randint(4, 7))) for _ in range(60)}
    normal = sorted(pieces)
    tokens = ["<unk>", "<s>", "</s>", *(f"<0x{b:02X}>" for b in range(256)), *normal]
    scores = [0.0] * 259 + rng.sample(range(-5000, 0), len(normal))
    md = {"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": tokens,
          "tokenizer.ggml.scores": [float(s) for s in scores],
          "tokenizer.ggml.token_type": [2, 3, 3, *[6] * 256, *[1] * len(normal)],
          "tokenizer.ggml.add_space_prefix": False}
    return md, {t: i for i, t in enumerate(tokens)}, [float(s) for s in scores]


_SYNTH = [_synthetic_vocab(seed) for seed in range(3)]
_TOKS = [Tokenizer.from_metadata(md) for md, _, _ in _SYNTH]


@settings(max_examples=200, deadline=None)
@given(which=st.integers(0, 2), text=st.text("ab c▁dé", max_size=40))
def test_bpe_from_scores_equals_llama_cpp_bigram_merging(which, text):
    """Including characters outside the vocabulary (d, é: byte fallback) and literal `▁`."""
    md, vocab, scores = _SYNTH[which]
    expected = _llama_spm(text.replace(" ", "▁"), vocab, scores)
    assert _TOKS[which].encode(text, add_special=False) == expected


_GEMMA_TEXT = st.text(st.one_of(
    st.sampled_from("abcdefghijklmnopqrstuvwxyz ABCXYZ0123456789.,;:!?'\"()-_/=+*#@"),
    st.characters(min_codepoint=0xC0, max_codepoint=0x24F),  # accented Latin
    st.characters(min_codepoint=0x400, max_codepoint=0x4FF),  # Cyrillic
    st.characters(min_codepoint=0x4E00, max_codepoint=0x9FFF),  # CJK
    st.characters(min_codepoint=0x1F300, max_codepoint=0x1FAFF),  # emoji (some byte fallback)
    st.characters(min_codepoint=0x1400, max_codepoint=0x167F)), max_size=30)  # syllabics


@settings(max_examples=150, deadline=None)
@given(text=_GEMMA_TEXT)
def test_real_gemma3_vocabulary_equals_llama_cpp_bigram_merging(text):
    """On the 262k vocabulary itself (text without the user-defined whitespace-run tokens, which
    llama.cpp splits out before merging)."""
    assume("  " not in text)
    vocab, scores = _gemma3_pieces()
    expected = _llama_spm(text.replace(" ", "▁"), vocab, scores)
    assert tokenizer("gemma3").encode(text, add_special=False) == expected


@functools.lru_cache(maxsize=1)
def _gemma3_pieces() -> tuple[dict[str, int], list[float]]:
    md = metadata("gemma3")
    return {t: i for i, t in enumerate(md["tokenizer.ggml.tokens"])}, md["tokenizer.ggml.scores"]


def test_fast_merges_equal_the_plain_definition_on_gemma3():
    md = metadata("gemma3")
    tokens, scores = md["tokenizer.ggml.tokens"], md["tokenizer.ggml.scores"]
    user = frozenset(i for i, t in enumerate(md["tokenizer.ggml.token_type"]) if t == 4)
    fast = spm_merges(tokens, scores, user)
    assert len(fast) > 500_000
    assert fast == spm_merges_reference(tokens, scores, user)


@pytest.mark.parametrize("pieces", [["a", "b", "ab", "ba", "aba"], ["x"], ["ab", "a"]])
def test_fast_merges_on_small_and_degenerate_vocabularies(pieces):
    scores = [-float(i) for i in range(len(pieces))]
    assert spm_merges(pieces, scores) == spm_merges_reference(pieces, scores)


def test_repeated_pieces_fall_back_to_the_exact_loop():
    pieces, scores = ["a", "b", "ab", "ab"], [-1.0, -2.0, -3.0, -4.0]
    assert spm_merges(pieces, scores) == spm_merges_reference(pieces, scores) == [("a", "b")]


def test_gemma3_vocabulary_loads_fast():
    """262,144 pieces, 513k merges: llama.cpp itself needs about 0.4 s for this vocabulary."""
    md = metadata("gemma3")
    start = time.perf_counter()
    tok = Tokenizer.from_metadata(md)
    elapsed = time.perf_counter() - start
    assert tok.encode("Hello world", add_special=False) == [9259, 1902]
    assert elapsed < 4.0, f"{elapsed:.2f} s"  # about 1.3 s on the 2-core CI host
