"""A prompt cache's lookup by token blocks: which entry shares the longest prefix with a prompt,
without comparing the prompt with every entry.

The plain way, `common_prefix` with each entry at each admission, costs O(entries x shared tokens)
on the engine thread: with an agent fleet's hundreds of entries sharing a long system prompt it
took 19% of that thread (py-spy, 64 streams, 640 entries), ~25 ms per admission at 2000 shared
tokens (playground/prompt_cache_lookup.py), time in which no step runs.

Here the entries' tokens are cut into blocks of BLOCK tokens, as vLLM's prefix-cache block hashes:
node i of an entry stands for its tokens [0, BLOCK*(i+1)) and is keyed by (its parent node's id,
the block's tokens). The key holds the tokens themselves, so a dict hit is an exact match (the
dict compares keys, it never trusts a hash alone), and the parent's id chains the blocks without
storing a prefix more than once: a trie with BLOCK-token edges (SGLang's RadixAttention, coarser).
Each node lists the entries holding its whole prefix.

`best(prompt)` walks the prompt's full blocks down the trie (one dict look-up per block) to the
deepest node it reaches. Every entry holding that node's prefix shares at least its tokens with
the prompt; every other entry shares fewer (it differs inside the prefix, or is shorter). So the
answer is among that node's entries, and each shares fewer than BLOCK further tokens (or the next
node would have matched): one compare of at most BLOCK tokens per candidate. Matches shorter than
one block (a short prompt or short entries) take the same step from the root, whose candidates are
the entries starting with the prompt's first token. Cost: O(len(prompt) / BLOCK + candidates x
BLOCK), whatever the number of entries elsewhere.

Ties go to the least recently used entry, as the plain scan over an LRU-ordered dict with a strict
`>` chose: the index stamps each entry when it is added or touched (the cache's `move_to_end`), and
the smallest stamp among the longest matches wins.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from slotserver.engine.slots import common_prefix

BLOCK = 16   # tokens per trie edge (vLLM's default block size); see best() for the trade-off
ROOT = -1    # the parent id of every entry's first block


@dataclass
class _Record:
    """An entry as the index holds it: nodes and candidate maps key it by `id`, so that a look-up
    never hashes its tokens (a tuple's hash is not cached: thousands of tokens, each time)."""
    id: int
    tokens: tuple[int, ...]
    stamp: int                                                   # last add / touch: the LRU order
    path: list["_Node"] = field(default_factory=list)           # its nodes, root first


@dataclass
class _Node:
    id: int
    key: tuple[int, tuple[int, ...]]                             # (parent id, BLOCK tokens)
    entries: dict[int, _Record] = field(default_factory=dict)   # record id -> the entries holding the prefix


class PrefixIndex:
    """Token sequences (a cache's entries' keys) -> the one sharing the longest prefix with a query.

    Not thread-safe: its owner serializes `add`, `remove`, `touch` and `best`."""

    def __init__(self) -> None:
        self._nodes: dict[tuple[int, tuple[int, ...]], _Node] = {}
        self._records: dict[tuple[int, ...], _Record] = {}
        self._first: dict[int, dict[int, _Record]] = {}   # first token -> record id -> the entries
        self._clock = itertools.count()
        self._ids = itertools.count()

    def __len__(self) -> int:
        return len(self._records)

    def __contains__(self, tokens: tuple[int, ...]) -> bool:
        return tokens in self._records

    def add(self, tokens: tuple[int, ...]) -> None:
        """Index `tokens` as the most recently used; an entry already in is touched. No tokens: nothing
        (an empty entry shares no token with any prompt, so `best` never offers it)."""
        if not tokens:
            return
        if tokens in self._records:
            self.touch(tokens)
            return
        rec = self._records[tokens] = _Record(next(self._ids), tokens, next(self._clock))
        parent = ROOT
        for start in range(0, len(tokens) - BLOCK + 1, BLOCK):
            key = (parent, tokens[start:start + BLOCK])
            node = self._nodes.get(key)
            if node is None:
                node = self._nodes[key] = _Node(next(self._ids), key)
            node.entries[rec.id] = rec
            rec.path.append(node)
            parent = node.id
        self._first.setdefault(tokens[0], {})[rec.id] = rec

    def remove(self, tokens: tuple[int, ...]) -> None:
        """Forget `tokens` (absent: nothing). A node left with no entry goes: its children, whose
        entries all hold its prefix too, are empty and gone already."""
        rec = self._records.pop(tokens, None)
        if rec is None:
            return
        for node in reversed(rec.path):
            del node.entries[rec.id]
            if not node.entries:
                del self._nodes[node.key]
        firsts = self._first[tokens[0]]
        del firsts[rec.id]
        if not firsts:
            del self._first[tokens[0]]

    def touch(self, tokens: tuple[int, ...]) -> None:
        """`tokens` is now the most recently used (the cache moved it to the end of its LRU order)."""
        rec = self._records.get(tokens)
        if rec is not None:
            rec.stamp = next(self._clock)

    def best(self, prompt: tuple[int, ...]) -> tuple[tuple[int, ...], int] | None:
        """The entry sharing the longest prefix with `prompt` and that length (ties: the least recently
        used), or None when no entry shares a token. Exactly `max` of `common_prefix` over all entries.
        Past the deepest shared block a candidate shares at most BLOCK - 1 more tokens (a whole
        block more would have matched the next node), so one block of each is compared. A smaller
        BLOCK makes that compare cheaper (it is what grows with the entries: a new agent's prompt
        ties with every entry sharing the system prompt) and the walk longer (a look-up per block):
        16 against 64 took the 640-entry tie from 1.7 to 0.36 ms for ~10 us more walk at 2000 tokens."""
        if not prompt:
            return None
        base, candidates = self._deepest(prompt)
        tail = prompt[base:base + BLOCK]
        best, n_best = None, 0
        for rec in candidates.values():
            n = base + common_prefix(rec.tokens[base:base + BLOCK], tail)
            if n > n_best or (n == n_best and best is not None and rec.stamp < best.stamp):
                best, n_best = rec, n
        return None if best is None else (best.tokens, n_best)

    def _deepest(self, prompt: tuple[int, ...]) -> tuple[int, dict[int, _Record]]:
        """(tokens matched by the deepest node the prompt's full blocks reach, that node's entries);
        no first block matched: (0, the entries starting with the prompt's first token)."""
        node, parent, base = None, ROOT, 0
        while base + BLOCK <= len(prompt):
            child = self._nodes.get((parent, prompt[base:base + BLOCK]))
            if child is None:
                break
            node, parent, base = child, child.id, base + BLOCK
        if node is None:
            return 0, self._first.get(prompt[0], {})
        return base, node.entries
