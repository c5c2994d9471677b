"""One model's runtime record in the router: its status, its child process, its load on the router.

Status values are llama-server's (`GET /models` `status.value`): unloaded, loading, loaded.
(`sleeping` belongs to a child's --sleep-idle-seconds, which the router passes on but does not track.)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from slotserver.router.child import Child

UNLOADED, LOADING, LOADED = "unloaded", "loading", "loaded"


@dataclass
class Instance:
    name: str
    status: str = UNLOADED
    child: "Child | None" = None
    req_count: int = 0          # proxied requests in flight: a busy model is never evicted
    last_used: float = 0.0      # monotonic time of the last POST routed to it (LRU order)
    stopping: bool = False      # asked to exit; takes no new request
    exit_code: int | None = None
    failed: bool = False        # the last child exited without being asked to (or failed to load)
    args: tuple[str, ...] = ()  # the last child's command line (shown in /models)
    info: dict | None = None    # the child's /v1/models entry, merged into the router's listing

    @property
    def running(self) -> bool:
        return self.status in (LOADING, LOADED)

    @property
    def ready(self) -> bool:
        return self.status == LOADED and not self.stopping
