"""One upstream server as the router sees it: reachable or not, how loaded, what it answered.

`load` is what the routing policy compares. It is the larger of two views: the requests this
router has in flight there (exact, updated the moment a request is sent, so a burst of arrivals
spreads at once) and the busy slots the replica's own `/slots` reported at the last poll (which
also sees traffic from other routers or direct clients, but lags by up to a poll interval).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from urllib.parse import urlsplit


@dataclass
class Replica:
    url: str
    healthy: bool = False          # the last /health poll (or request) succeeded; False drains it
    status: str = "unknown"        # "ok", "loading", "down: <why>"
    inflight: int = 0              # requests this router has open on it now
    busy_slots: int = 0            # from /slots: slots processing at the last poll
    n_slots: int | None = None     # from /slots; None when /slots is off or unreadable
    cache_seen: int = -1           # from /slots: sum of the slots' prompt_cache counters (restart detection)
    routed: dict[str, int] = field(default_factory=dict)    # decision -> requests sent here
    failures: int = 0              # requests that failed here before anything was streamed
    leaving: bool = False          # removed from the upstreams file: goes once its requests are done

    @property
    def name(self) -> str:
        """host:port, the `replica` label of the aggregated metrics."""
        parts = urlsplit(self.url)
        return parts.netloc + (parts.path if parts.path not in ("", "/") else "")

    @property
    def load(self) -> int:
        return max(self.inflight, self.busy_slots)

    def has_free_slot(self) -> bool:
        return self.n_slots is not None and self.load < self.n_slots

    def snapshot(self) -> dict:
        return {"url": self.url, "healthy": self.healthy, "status": self.status, "inflight": self.inflight,
                "busy_slots": self.busy_slots, "n_slots": self.n_slots, "load": self.load,
                "routed": dict(self.routed), "failures": self.failures}
