"""AffinityTable: which replica last served each prompt prefix block (a bounded LRU map).

This is the router's picture of what each replica holds. The replicas' `/slots` do not show prompt
text by default (slotserver hides it without --slots-debug, as llama-server does), so the router
remembers where it sent each prefix instead, as SGLang's cache-aware router keeps its approximate
radix tree. The picture is corrected by what the replicas report: a replica that fails, or whose
`/slots` counters go back (it restarted with an empty cache), has its entries dropped. A replica
may also have evicted a prefix the table still names; the policy then only loses what round-robin
would have lost anyway.

Each block also remembers whether a prompt *ended* there. A request whose longest match ends at
such a block continues an earlier prompt: the next turn of the same conversation (its history is
the earlier prompt plus the answer). A match that stops inside an earlier prompt is a fork: the
request only shares a prefix with others (an agent's system prompt, a common document), which is
cheap to recompute anywhere; the policy treats the two differently.
"""

from __future__ import annotations

from collections import OrderedDict

from slotserver.replicas.prefix import PromptKey


class AffinityTable:
    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        # block hash -> (replica url, whether a prompt ended at this block)
        self._owner: OrderedDict[bytes, tuple[str, bool]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._owner)

    def longest_match(self, key: PromptKey) -> tuple[int, str | None, bool]:
        """(blocks matched, owner of the longest matched prefix, whether the prompt continues an
        earlier one). The hashes are chained, so the first miss ends the prefix; the deepest block's
        owner is the replica that served it last. It continues an earlier prompt when it is that
        very prompt again, or when the match ends where an earlier prompt ended and the prompt goes
        on past it (a fork inside an earlier prompt's unhashed tail does not go on past it)."""
        if (exact := self._owner.get(key.whole)) is not None:
            return len(key.blocks), exact[0], True
        n, owner, ended = 0, None, False
        for h in key.blocks:
            entry = self._owner.get(h)
            if entry is None:
                break
            n, (owner, ended) = n + 1, entry
        return n, owner, ended and n < len(key.blocks)

    def record(self, key: PromptKey, url: str) -> None:
        """The replica now holds this prompt (it is being sent all of it, which ends at the last block)."""
        last = len(key.blocks) - 1
        for i, h in enumerate(key.blocks + [key.whole]):
            ended = i == last or (i < last and h in self._owner and self._owner[h][1])
            self._owner[h] = (url, ended)
            self._owner.move_to_end(h)
        while len(self._owner) > self.capacity:
            self._owner.popitem(last=False)

    def forget(self, url: str) -> int:
        """Drop every block owned by `url` (it failed or restarted); how many were dropped."""
        dead = [h for h, (u, _) in self._owner.items() if u == url]
        for h in dead:
            del self._owner[h]
        return len(dead)
