"""The prompt cache's block index (prefix_index) answers exactly what comparing every entry did: the
same longest shared prefix, the same entry among ties (the least recently used), None when nothing
shares a token; after any sequence of saves, look-ups and LRU evictions."""

from __future__ import annotations

import random
from collections import OrderedDict

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import slotserver.engine.prefix_index as prefix_index
from slotserver.engine.prefix_index import BLOCK, PrefixIndex
from slotserver.engine.prompt_cache import PromptCache
from slotserver.engine.slots import common_prefix

_rng = random.Random(7)
STEMS = [tuple(_rng.randrange(3) for _ in range(3 * BLOCK + 20)) for _ in range(3)]   # shared prefixes
BYTES_PER_TOKEN = 8   # k and v: one float32 each per token


class PlainScan:
    """The reference: the RAM cache before the index (an LRU dict scanned in order, strict `>`)."""

    def __init__(self, limit: int) -> None:
        self.limit, self.bytes, self.entries = limit, 0, OrderedDict()

    def save(self, tokens: tuple[int, ...]) -> bool:
        nbytes = BYTES_PER_TOKEN * len(tokens)
        if not tokens or 0 <= self.limit < nbytes:
            return False
        if tokens in self.entries:
            self.entries.move_to_end(tokens)
            return True
        self.entries[tokens] = nbytes
        self.bytes += nbytes
        while 0 <= self.limit < self.bytes:
            self.bytes -= self.entries.popitem(last=False)[1]
        return True

    def best(self, prompt: tuple[int, ...]) -> tuple[tuple[int, ...], int] | None:
        best, n_best = None, 0
        for tokens in self.entries:
            n = common_prefix(tokens, prompt)
            if n > n_best:
                best, n_best = tokens, n
        if best is None:
            return None
        self.entries.move_to_end(best)
        return best, n_best


def _kv(tokens: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.zeros(len(tokens)), torch.zeros(len(tokens))   # BYTES_PER_TOKEN in all


# A stem cut anywhere (0 to 3 blocks and more: ties, partial blocks, prompts shorter and longer than
# entries) then a tail from a 3-token alphabet (divergence at any depth, matches shorter than a block).
sequences = st.builds(lambda stem, cut, tail: STEMS[stem][:cut] + tuple(tail),
                      st.integers(0, len(STEMS) - 1), st.integers(0, len(STEMS[0])),
                      st.lists(st.integers(0, 2), max_size=BLOCK + 10))
ops = st.lists(st.tuples(st.sampled_from(["save", "best"]), sequences), min_size=20, max_size=60)


@settings(max_examples=60, deadline=None)   # seeded by the conftest profile
@given(ops=ops, limit=st.sampled_from([-1, 2500, 6000]))
def test_the_index_answers_as_the_plain_scan(ops, limit):
    cache, ref = PromptCache(limit), PlainScan(limit)
    for op, tokens in ops:
        if op == "save":
            assert cache.save(tokens, *_kv(tokens)) == ref.save(tokens)
        else:
            found = cache.best(tokens)
            assert (found and (found[0], found[2])) == (ref.best(tokens) or None)
        assert [t for _, t in cache.entries] == list(ref.entries)   # the same LRU order, so the same evictions
        assert sum(map(len, cache.indexes.values())) == len(cache.entries) and cache.bytes == ref.bytes


def test_a_match_ending_anywhere_in_a_block_counts_every_token():
    """Past the deepest shared block, 0 to BLOCK - 1 more tokens; a short entry matches fully."""
    index = PrefixIndex()
    stem = STEMS[0][: 2 * BLOCK]
    for extra in (0, 1, BLOCK - 1):
        prompt = stem[: BLOCK + extra] + (5,) + stem[BLOCK + extra + 1:]
        for tokens in (stem, stem[: BLOCK + extra]):
            index.add(tokens)
            assert index.best(prompt) == (tokens, BLOCK + extra)
            index.remove(tokens)


def test_ties_go_to_the_least_recently_used():
    index = PrefixIndex()
    a, b = STEMS[0][:BLOCK] + (9, 9), STEMS[0][:BLOCK] + (8, 8)
    index.add(a)
    index.add(b)
    assert index.best(STEMS[0][:BLOCK] + (7,)) == (a, BLOCK)
    index.touch(a)
    assert index.best(STEMS[0][:BLOCK] + (7,)) == (b, BLOCK)


def test_nothing_shared_is_none_and_removal_forgets_everything():
    index = PrefixIndex()
    entries = [STEMS[i][:n] for i in range(3) for n in (1, BLOCK - 1, BLOCK, 2 * BLOCK + 5)]
    for tokens in entries:
        index.add(tokens)
    assert index.best((5,) + STEMS[0]) is None and index.best(()) is None
    assert index.best(STEMS[1]) == (STEMS[1][: 2 * BLOCK + 5], 2 * BLOCK + 5)
    for tokens in entries:
        index.remove(tokens)
    assert len(index) == 0 and index.best(STEMS[1]) is None
    assert not index._nodes and not index._first and not index._records   # nothing outlives its entries


def test_a_fleet_sharing_a_long_prompt_costs_one_compare(monkeypatch):
    """640 agents' histories sharing 2000 tokens: an agent's next prompt (its history and more)
    compares its last partial block with one entry, not with all of them."""
    rng = random.Random(3)
    shared = tuple(rng.randrange(32000) for _ in range(2000))
    histories = [shared + tuple(rng.randrange(32000) for _ in range(300)) for _ in range(640)]
    index = PrefixIndex()
    for tokens in histories:
        index.add(tokens)
    calls = []
    monkeypatch.setattr(prefix_index, "common_prefix", lambda a, b: calls.append(1) or common_prefix(a, b))
    assert index.best(histories[123] + (1, 2, 3)) == (histories[123], 2300)
    assert len(calls) == 1
