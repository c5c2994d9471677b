"""The routing policy: which replica gets a request.

`prefix` (the default), in order:
1. **prefix hit**: the replica that last served the longest prefix of this prompt (AffinityTable),
   if it is healthy and not overloaded. Its KV cache (or RAM prompt cache) most likely still holds
   that prefix, so it computes only the new tail: for an agent re-sending its whole history each
   turn, that is the difference between prefilling a few dozen tokens and a few thousand.
2. **hash**: otherwise a consistent (rendezvous) hash of the prompt's leading blocks, if that replica
   is not overloaded. Without any shared state it sends the same conversation to the same replica
   from any router (several routers, or one restarted with an empty table), and moves only 1/N of
   the keys when a replica joins or leaves.
3. **least loaded**: otherwise the healthy replica with the lowest load (ties: fewest requests
   routed so far, then URL order), which is also where requests without a prompt go.

"Overloaded" means: no free slot (from /slots) AND more than `balance_slack` requests above the
least loaded replica. Affinity is worth a short wait (a cached prefix saves its whole prefill) but
not an unbounded queue while another replica idles; the request that moves records its prefix on
the new replica, so the conversation follows it there (the load rebalances, durably).

`round-robin` and `least-loaded` ignore prefixes; they are the baselines the benchmark compares to.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from slotserver.router.affinity import AffinityTable
from slotserver.router.replica import Replica


@dataclass(frozen=True)
class Decision:
    replica: Replica
    reason: str            # "prefix_hit" | "hash" | "least_loaded" | "round_robin"
    matched_blocks: int = 0


def rendezvous(key: bytes, replicas: list[Replica]) -> Replica:
    """Highest-random-weight hashing: each (key, replica) pair gets a score, the best wins."""
    return max(replicas, key=lambda r: hashlib.blake2b(key + r.url.encode(), digest_size=8).digest())


def least_loaded(replicas: list[Replica]) -> Replica:
    return min(replicas, key=lambda r: (r.load, sum(r.routed.values())))


class Policy:
    def __init__(self, name: str, table: AffinityTable, balance_slack: int) -> None:
        self.name, self.table, self.slack = name, table, balance_slack
        self._rr = 0

    def overloaded(self, r: Replica, candidates: list[Replica]) -> bool:
        if r.has_free_slot():
            return False
        return r.load - min(c.load for c in candidates) > self.slack

    def choose(self, candidates: list[Replica], hashes: list[bytes], lead: bytes | None,
               exclude: set[str] = frozenset()) -> Decision | None:
        """The replica for a request, among healthy `candidates` not in `exclude` (already failed
        for this request); None when none is left. `lead` is the consistent-hash key (None: no prompt)."""
        pool = [r for r in candidates if r.url not in exclude]
        if not pool:
            return None
        if self.name == "round-robin":
            self._rr += 1
            return Decision(pool[self._rr % len(pool)], "round_robin")
        if self.name == "prefix" and lead is not None:
            n, owner = self.table.longest_match(hashes)
            hit = next((r for r in pool if r.url == owner), None)
            if hit is not None and not self.overloaded(hit, pool):
                return Decision(hit, "prefix_hit", n)
            hashed = rendezvous(lead, pool)
            if not self.overloaded(hashed, pool):
                return Decision(hashed, "hash", n)
        return Decision(least_loaded(pool), "least_loaded")

    def sent(self, decision: Decision, hashes: list[bytes]) -> None:
        """Remember that the chosen replica now holds this prompt's blocks."""
        if self.name == "prefix" and hashes:
            self.table.record(hashes, decision.replica.url)
