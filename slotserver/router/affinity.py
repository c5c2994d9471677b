"""AffinityTable: which replica last served each prompt prefix block (a bounded LRU map).

This is the router's picture of what each replica holds. The replicas' `/slots` do not show prompt
text by default (slotserver hides it without --slots-debug, as llama-server does), so the router
remembers where it sent each prefix instead, as SGLang's cache-aware router keeps its approximate
radix tree. The picture is corrected by what the replicas report: a replica that fails, or whose
`/slots` counters go back (it restarted with an empty cache), has its entries dropped. A replica
may also have evicted a prefix the table still names; the policy then only loses what round-robin
would have lost anyway.
"""

from __future__ import annotations

from collections import OrderedDict


class AffinityTable:
    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._owner: OrderedDict[bytes, str] = OrderedDict()   # block hash -> replica url

    def __len__(self) -> int:
        return len(self._owner)

    def longest_match(self, hashes: list[bytes]) -> tuple[int, str | None]:
        """(blocks matched, owner of the longest matched prefix). The hashes are chained, so the
        first miss ends the prefix; the deepest block's owner is the one that served it last."""
        n, owner = 0, None
        for h in hashes:
            url = self._owner.get(h)
            if url is None:
                break
            n, owner = n + 1, url
        return n, owner

    def record(self, hashes: list[bytes], url: str) -> None:
        """The replica now holds these blocks (it is being sent the whole prompt)."""
        for h in hashes:
            self._owner[h] = url
            self._owner.move_to_end(h)
        while len(self._owner) > self.capacity:
            self._owner.popitem(last=False)

    def forget(self, url: str) -> int:
        """Drop every block owned by `url` (it failed or restarted); how many were dropped."""
        dead = [h for h, u in self._owner.items() if u == url]
        for h in dead:
            del self._owner[h]
        return len(dead)
