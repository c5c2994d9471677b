"""RouterStats: the router's own counters, exported on /metrics as `slotserver_replica_router_*`."""

from __future__ import annotations

from collections import Counter

from slotserver.replicas.policy import Decision

REASONS = ("prefix_hit", "hash", "least_loaded", "round_robin")
PREFIX = "slotserver_replica_router_"


class RouterStats:
    def __init__(self) -> None:
        self.routed: Counter[tuple[str, str]] = Counter()   # (replica name, reason) -> requests
        self.retries = 0        # attempts that failed before anything was streamed (the next replica, if any, tries)
        self.cut = 0            # answers cut because the replica broke off mid-stream
        self.disconnects = 0    # clients that left before their answer ended

    def count(self, d: Decision) -> None:
        self.routed[(d.replica.name, d.reason)] += 1
        d.replica.routed[d.reason] = d.replica.routed.get(d.reason, 0) + 1

    def by_reason(self) -> dict[str, int]:
        out = dict.fromkeys(REASONS, 0)
        for (_, reason), n in self.routed.items():
            out[reason] += n
        return out

    def prometheus(self, replicas) -> str:
        """The router's counters and per-replica gauges in Prometheus text (`slotserver_replica_router_*`:
        not to be confused with the --models-dir router's metrics)."""
        p = PREFIX
        lines = [f"# HELP {p}requests_total Requests routed, by replica and reason (prefix_hit: the replica "
                 "holding the longest prefix; hash, least_loaded, round_robin: fallbacks).",
                 f"# TYPE {p}requests_total counter"]
        lines += [f'{p}requests_total{{replica="{_esc(name)}",reason="{reason}"}} {n}'
                  for (name, reason), n in sorted(self.routed.items())]
        for name, doc, value in (("retries", "Attempts that failed before anything was streamed "
                                  "(another replica tried).", self.retries),
                                 ("cut", "Answers cut because a replica failed mid-stream.", self.cut),
                                 ("client_disconnects", "Clients that left before their answer ended.",
                                  self.disconnects)):
            lines += [f"# HELP {p}{name}_total {doc}", f"# TYPE {p}{name}_total counter", f"{p}{name}_total {value}"]
        for name, doc, get in (("replica_healthy", "1 when the replica is in rotation.", lambda r: int(r.healthy)),
                               ("replica_inflight", "Requests this router has open on the replica.",
                                lambda r: r.inflight)):
            lines += [f"# HELP {p}{name} {doc}", f"# TYPE {p}{name} gauge"]
            lines += [f'{p}{name}{{replica="{_esc(r.name)}"}} {get(r)}' for r in replicas]
        return "\n".join(lines) + "\n"


def _esc(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')
