"""BPE merges that make `tokenizers` behave like llama.cpp's SentencePiece (SPM) tokenizer.

llama.cpp's `llm_tokenizer_spm_session` (a port of SentencePiece's BPE encoder) starts from single
characters and repeatedly merges the adjacent pair whose concatenation is the vocabulary piece
with the highest score (leftmost first on ties); characters that never joined a piece become
`<0xXX>` byte tokens. A `tokenizers` BPE gives the same result when its merge list holds every
way of cutting every piece into two pieces, ranked by the score of the piece they form (the
transformers `SentencePieceExtractor` trick). Two rankings can only differ where two *different*
pieces share a score and their candidate pairs overlap; llama.cpp then takes the leftmost, BPE the
one listed first (ties are listed by piece id, then cut position).

Enumerating the cuts is the expensive part for a 262k vocabulary (about 2.4M candidate cuts), so
`spm_merges` finds them with numpy: a polynomial hash of every prefix proposes (left, right) ids,
and a proposal is kept only if the lengths and a second, independent 64-bit hash agree too. Two
pieces sharing the first hash send the whole computation to the plain loop
(`spm_merges_reference`); the tests compare both on the real 262k gemma3 vocabulary.
"""

from __future__ import annotations

import gc
from contextlib import contextmanager
from typing import Iterator, Sequence

import numpy as np

__all__ = ["no_gc", "spm_merges", "spm_merges_reference"]

def spm_merges_reference(pieces: Sequence[str], scores: Sequence[float],
                         exclude: frozenset[int] = frozenset()) -> list[tuple[str, str]]:
    """The merge list by a plain loop over every cut (the definition `spm_merges` must match).

    `pieces[i]` is token i's text (a repeated text counts as its last id, as in llama.cpp),
    `scores[i]` its score; ids in `exclude` (pieces that can never be formed inside a text
    fragment, e.g. user-defined tokens) get no merges.
    """
    vocab = {p: i for i, p in enumerate(pieces)}
    found: list[tuple[float, int, int, str, str]] = []
    for pid, piece in enumerate(pieces):
        if pid in exclude or vocab[piece] != pid:  # a repeated text is its last id (llama.cpp)
            continue
        for cut in range(1, len(piece)):
            left, right = piece[:cut], piece[cut:]
            if left in vocab and right in vocab:
                found.append((-float(scores[pid]), pid, cut, left, right))
    found.sort(key=lambda m: m[:3])
    return [(m[3], m[4]) for m in found]


def spm_merges(pieces: Sequence[str], scores: Sequence[float],
               exclude: frozenset[int] = frozenset()) -> list[tuple[str, str]]:
    """Same list as `spm_merges_reference`, computed with vectorised hashing (fast)."""
    n = len(pieces)
    lens = np.fromiter(map(len, pieces), np.int64, n)
    if n == 0 or int(lens.max()) < 2:
        return []
    if int(lens.min()) == 0:  # an empty piece has no prefix hash to stand for it
        return spm_merges_reference(pieces, scores, exclude)
    by_length = np.argsort(-lens, kind="stable")  # pieces longer than `cut` come first
    codes = np.frombuffer("".join(pieces).encode("utf-32-le"), np.uint32).astype(np.uint64) + 1
    hashes = [_Hashes(codes, lens, by_length, base) for base in _BASES]
    table = _HashTable(hashes[0].full)
    if not table.unique:  # a repeated text, or two pieces collide
        return spm_merges_reference(pieces, scores, exclude)
    keep = np.ones(n, bool)
    keep[list(exclude)] = False
    longer = np.searchsorted(-lens[by_length], -np.arange(int(lens.max())), side="left")
    found = [_cuts_at(cut, by_length[:longer[cut]], hashes, lens, keep, table)
             for cut in range(1, int(lens.max()))]
    pid, left, right, cut = (np.concatenate(parts) for parts in zip(*found))
    piece_rank = np.empty(n, np.int64)
    piece_rank[np.lexsort((np.arange(n), -np.asarray(scores, np.float64)))] = np.arange(n)
    rank = np.argsort(piece_rank[pid] * int(lens.max()) + cut, kind="stable")
    text = np.asarray(pieces, dtype=object)
    with no_gc():  # half a million tuples would trigger many useless collections
        return list(zip(text[left[rank]].tolist(), text[right[rank]].tolist()))


@contextmanager
def no_gc() -> Iterator[None]:
    """Pause the cyclic garbage collector: building a large vocabulary allocates millions of
    acyclic objects, and each automatic full collection on the way costs about 0.1 s."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


_BASES = (np.uint64(0x100000001B3), np.uint64(0xC2B2AE3D27D4EB4F))  # odd; wrap modulo 2**64


class _Hashes:
    """Polynomial hashes (one base) of every prefix of every piece, stored flat: `at[k]` is the
    hash of the first k+1 characters of the piece starting at flat offset `start`, at start + k.
    Memory is one number per character of the vocabulary, whatever the longest piece."""

    def __init__(self, codes: np.ndarray, lens: np.ndarray, by_length: np.ndarray,
                 base: np.uint64) -> None:
        self.starts = np.zeros(len(lens), np.int64)
        np.cumsum(lens[:-1], out=self.starts[1:])
        self.at = np.zeros(len(codes), np.uint64)
        self.powers = np.ones(int(lens.max()) + 1, np.uint64)
        longest_first = self.starts[by_length]
        counts = np.bincount(lens, minlength=int(lens.max()) + 1)
        alive = len(lens) - np.cumsum(counts)  # alive[k]: pieces longer than k
        with np.errstate(over="ignore"):
            self.at[longest_first[:alive[0]]] = codes[longest_first[:alive[0]]]
            for k in range(1, int(lens.max())):
                pos = longest_first[:alive[k]] + k
                self.at[pos] = self.at[pos - 1] * base + codes[pos]
                self.powers[k] = self.powers[k - 1] * base
            self.powers[-1] = self.powers[-2] * base
        self.full = self.at[self.starts + lens - 1]

    def split(self, cut: int, pid: np.ndarray, lens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Hashes of pieces[pid][:cut] and pieces[pid][cut:]."""
        left = self.at[self.starts[pid] + cut - 1]
        with np.errstate(over="ignore"):
            return left, self.full[pid] - left * self.powers[lens[pid] - cut]


def _cuts_at(cut: int, pid: np.ndarray, hashes: list[_Hashes], lens: np.ndarray,
             keep: np.ndarray, table: _HashTable) -> tuple[np.ndarray, ...]:
    """(piece, left, right, cut) ids of the pieces `pid` (all longer than `cut`) that split at
    `cut` into two pieces.

    The first hash finds candidates; lengths and the second hash must agree as well, so a
    wrong merge would need two independent 64-bit hashes to collide on equal-length strings.
    """
    pid = pid[keep[pid]]
    left_hash, right_hash = hashes[0].split(cut, pid, lens)
    left, ok = table.find(left_hash)
    pid, left, right_hash = pid[ok], left[ok], right_hash[ok]
    right, ok = table.find(right_hash)
    pid, left, right = pid[ok], left[ok], right[ok]
    left_check, right_check = hashes[1].split(cut, pid, lens)
    ok = (lens[left] == cut) & (lens[right] == lens[pid] - cut)
    ok &= (hashes[1].full[left] == left_check) & (hashes[1].full[right] == right_check)
    return pid[ok], left[ok], right[ok], np.full(int(ok.sum()), cut, np.int64)


class _HashTable:
    """Piece ids by full hash: the hashes sorted, bucketed by their top bits for O(1) lookups.

    Polynomial hashes of short strings are small numbers, so they are first multiplied by an odd
    constant (a bijection modulo 2**64, Fibonacci hashing) to spread them over the top bits.
    """

    _MIX = np.uint64(0x9E3779B97F4A7C15)

    def __init__(self, full: np.ndarray) -> None:
        self.bits = max(int(len(full) * 4).bit_length(), 1)  # about 4 buckets per piece
        with np.errstate(over="ignore"):
            full = full * self._MIX
        self.ids = np.argsort(full, kind="stable")
        self.sorted = full[self.ids]
        self.unique = not np.any(self.sorted[1:] == self.sorted[:-1])
        per_bucket = np.bincount(self._bucket(self.sorted), minlength=2 ** self.bits)
        self.starts = np.concatenate([np.zeros(1, np.int64), np.cumsum(per_bucket)])
        self.depth = int(np.diff(self.starts).max())

    def _bucket(self, mixed: np.ndarray) -> np.ndarray:
        return (mixed >> np.uint64(64 - self.bits)).astype(np.int64)

    def find(self, hashes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Piece ids whose full hash equals each of `hashes`, and which lookups hit."""
        with np.errstate(over="ignore"):
            hashes = hashes * self._MIX
        bucket = self._bucket(hashes)
        ids, hit = np.zeros(len(hashes), np.int64), np.zeros(len(hashes), bool)
        at, end = self.starts[bucket], self.starts[bucket + 1]
        todo = np.nonzero(at < end)[0]
        for _ in range(self.depth):
            pos = at[todo]
            match = self.sorted[pos] == hashes[todo]
            ids[todo[match]], hit[todo[match]] = self.ids[pos[match]], True
            at[todo] += 1
            todo = todo[~match & (at[todo] < end[todo])]
        return ids, hit
