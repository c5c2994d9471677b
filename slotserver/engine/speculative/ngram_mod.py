"""ngram-mod: llama.cpp's hashed n-gram drafter (common/ngram-mod.cpp, speculative.cpp
`common_speculative_impl_ngram_mod`, PR 19164).

One table of 4M slots, shared by every sequence: the hash of each `n_match` consecutive tokens of
every prompt and output seen maps to the token that followed them (the latest wins). A draft
chains lookups from the last `n_match` tokens, up to `n_max` tokens; a chain shorter than `n_min`
is no draft. The table is reset when it is a quarter full, and after 5 drafts in a row of which
under a quarter was accepted. Why shared: an agent's second request finds the n-grams of the
first, and of other agents working on the same files.
"""

from __future__ import annotations

from slotserver.engine.speculative.drafter import DraftRequest

_MASK64 = (1 << 64) - 1
_MUL = 6364136223846793005
EMPTY = -1


class NgramMod:
    name = "ngram-mod"

    def __init__(self, n_match: int, n_min: int, n_max: int, size: int = 4 * 1024 * 1024) -> None:
        self.n, self.n_min, self.n_max, self.size = n_match, n_min, n_max, size
        self.table: dict[int, int] = {}   # slot -> next token: a dict holds the few slots in use
        self._seen: dict[int, int] = {}   # seq id -> how many of its tokens' n-grams are in the table
        self._last: dict[int, int] = {}   # seq id -> length of its last draft
        self._low: dict[int, int] = {}    # seq id -> drafts in a row mostly rejected

    def _idx(self, key) -> int:
        h = 0
        for t in key:
            h = (h * _MUL + t) & _MASK64   # llama.cpp's size_t arithmetic; ids are >= 0
        return h % self.size

    def _add_upto(self, seq_id: int, tokens: list[int], end: int) -> None:
        """Add the n-grams starting at positions seen .. end-1 (each with the token after it)."""
        n = self.n
        for i in range(self._seen.get(seq_id, 0), end):
            self.table[self._idx(tokens[i: i + n])] = tokens[i + n]
        self._seen[seq_id] = max(self._seen.get(seq_id, 0), end)
        if len(self.table) > self.size // 4:    # occupancy over 25%: llama.cpp resets
            self.reset()

    def reset(self) -> None:
        self.table.clear()
        self._seen = {k: 0 for k in self._seen}

    def propose(self, requests: list[DraftRequest]) -> list[list[int]]:
        return [self.propose_one(r.tokens, r.n_max, r.seq_id) for r in requests]

    def propose_one(self, tokens: list[int], n_max: int, seq_id: int = 0) -> list[int]:
        """tokens: the sequence so far, its last token sampled but not yet computed. -> the draft."""
        n, cur = self.n, len(tokens) - 1     # cur: the tokens before the sampled one (llama.cpp's prompt)
        self._last[seq_id] = 0
        if cur < n or n_max <= 0:
            return []
        if self._seen.get(seq_id, 0) + 32 < cur or seq_id not in self._seen:   # new n-grams in chunks
            self._add_upto(seq_id, tokens, cur - n)
        key = tokens[cur + 1 - n:]
        draft: list[int] = []
        for _ in range(self.n_max):   # the whole chain, so that n_min is checked on it, then cut to n_max
            t = self.table.get(self._idx(key), EMPTY)
            if t == EMPTY:
                break
            draft.append(t)
            key = key[1:] + [t]
        if len(draft) < self.n_min:
            return []
        self._last[seq_id] = min(len(draft), n_max)
        return draft[:n_max]

    def accepted(self, seq_id: int, n_drafted: int, n_accepted: int) -> None:
        """llama.cpp's low-acceptance rule: 5 drafts in a row with under 25% accepted reset the table."""
        last = self._last.get(seq_id, 0)
        if last <= 0:
            return
        if n_accepted / last < 0.25:
            self._low[seq_id] = self._low.get(seq_id, 0) + 1
            if self._low[seq_id] >= 5:
                self.reset()
                self._low[seq_id] = 0
        else:
            self._low[seq_id] = 0

    def forget(self, seq_id: int) -> None:
        """The sequence ended: drop its bookkeeping (its n-grams stay in the shared table)."""
        for d in (self._seen, self._last, self._low):
            d.pop(seq_id, None)
