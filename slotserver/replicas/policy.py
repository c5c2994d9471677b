"""The routing policy: which replica gets a request.

`prefix` (the default), in order:
1. **prefix hit**: the replica that last served the longest prefix of this prompt (AffinityTable),
   when this prompt *continues* an earlier one (the match ends where an earlier prompt ended: the
   next turn of a conversation, its whole history so far) and the replica is not overloaded. Its
   KV cache (or RAM prompt cache) most likely still holds that prefix, so it computes only the new
   tail: for an agent re-sending its whole history each turn, that is the difference between
   prefilling a few dozen tokens and a few thousand. (A share of the prompt, as SGLang's
   cache_threshold, cannot tell a conversation's own history from a long system prompt that every
   conversation shares; where the match ends can.)
2. Otherwise the request is placed among the *least busy* replicas (those with a free slot, or else
   those with the lowest load): the owner of a shorter match if it is one of them (a new
   conversation that shares only the agent's system prompt: a weak hit, still "prefix_hit"), else
   the one a consistent (rendezvous) **hash** of the prompt's leading blocks names. Without any
   shared state the hash sends the same prompt to the same replica from any router (several
   routers, or one restarted with an empty table), and moves only 1/N of the keys when a replica
   joins or leaves. Restricting it to the least busy replicas is what spreads a burst of new
   conversations that all start with the same system prompt (their leading blocks, hence their
   hash, are the same) over the fleet instead of piling them on one replica.
3. **least loaded** (the fallback, counted apart): the replica holding a long prefix was
   overloaded, so the request went to a least busy one instead, as in 2.

"Overloaded" means: no free slot (from /slots) AND more than `balance_slack` requests above the
least loaded replica. Affinity is worth a short wait (a cached prefix saves its whole prefill) but
not an unbounded queue while another replica idles; the request that moves records its prefix on
the new replica, so the conversation follows it there (the load rebalances, durably).

`round-robin` and `least-loaded` ignore prefixes; they are the baselines the benchmark compares to.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from slotserver.replicas.affinity import AffinityTable
from slotserver.replicas.prefix import PromptKey
from slotserver.replicas.replica import Replica


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

    def choose(self, candidates: list[Replica], key: PromptKey | None,
               exclude: set[str] = frozenset()) -> Decision | None:
        """The replica for a request, among healthy `candidates` not in `exclude` (already failed
        for this request); None when none is left. `key` is None for a request without a prompt."""
        pool = [r for r in candidates if r.url not in exclude]
        if not pool:
            return None
        if self.name == "round-robin":
            self._rr += 1
            return Decision(pool[self._rr % len(pool)], "round_robin")
        if self.name != "prefix" or key is None:
            return Decision(least_loaded(pool), "least_loaded")
        n, url, continues = self.table.longest_match(key)
        owner = next((r for r in pool if r.url == url), None)
        strong = owner is not None and continues
        if strong and not self.overloaded(owner, pool):
            return Decision(owner, "prefix_hit", n)
        low = min(r.load for r in pool)
        free = [r for r in pool if r.has_free_slot() or r.load == low]
        if owner in free:   # (a strong owner in `free` was not overloaded: it returned above)
            return Decision(owner, "prefix_hit", n)
        return Decision(rendezvous(key.lead, free), "least_loaded" if strong else "hash", n)

    def sent(self, decision: Decision, key: PromptKey | None) -> None:
        """Remember that the chosen replica now holds this prompt's blocks."""
        if self.name == "prefix" and key is not None:
            self.table.record(key, decision.replica.url)
