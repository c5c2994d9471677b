"""ngram-simple: prompt-lookup drafting, llama.cpp's `common_ngram_simple_draft` (common/ngram-map.cpp).

The last `size_n` tokens (the sampled one included) are looked up in the sequence's history, the
latest earlier occurrence first; the up to `size_m` tokens that followed it there are the draft.
No model, no state: code edits, quoting and summaries repeat long runs of their own context.
"""

from __future__ import annotations

from slotserver.engine.speculative.drafter import DraftRequest


class NgramSimple:
    name = "ngram-simple"

    def __init__(self, size_n: int, size_m: int) -> None:
        self.size_n, self.size_m = size_n, size_m

    def propose(self, requests: list[DraftRequest]) -> list[list[int]]:
        return [self.propose_one(r.tokens, r.n_max) for r in requests]

    def propose_one(self, tokens: list[int], n_max: int) -> list[int]:
        """tokens: the sequence so far, its last token sampled but not yet computed. -> the draft
        (at most min(size_m, n_max) tokens), or [] without a match."""
        n, cur = self.size_n, len(tokens)
        if cur <= n + self.size_m + 1 or n_max <= 0:   # llama.cpp's minimum history
            return []
        pattern = tokens[cur - n:]
        # search backwards, skipping the pattern's own place (position 0 counts as no match there)
        for j in range(cur - n - 1, 0, -1):
            if tokens[j] == pattern[0] and tokens[j: j + n] == pattern:
                copy = min(self.size_m, cur - (j + n), n_max)
                if min(self.size_m, cur - (j + n)) < n:     # llama.cpp: a draft shorter than the key is no draft
                    return []
                return tokens[j + n: j + n + copy]
        return []

    def accepted(self, seq_id: int, n_drafted: int, n_accepted: int) -> None:
        """Stateless: nothing to learn."""

    def forget(self, seq_id: int) -> None:
        """Stateless: nothing to drop."""
