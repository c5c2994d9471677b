"""The load queue and LRU eviction of `--models-max`: llama-server's `server_lru_sched`, same rules.

- Requests for a model that is not running queue; requests for the same model share one entry,
  so they need one slot between them and are all served by the one load the entry performs.
- Only the entry at the head loads, and only when a slot is free (FIFO; no overtaking).
- While queued entries outnumber free (or freeing) slots, idle models are evicted, least recently
  used first. A model serving a request (req_count > 0), one still loading, one already stopping,
  or one a queued request wants is never picked.
- An entry stays (marked loading) until its waiters leave, so a model just loaded for them cannot
  be evicted before they use it. A waiter that gives up (client gone) leaves; the slot freed for
  it goes to the next entry.

Pure bookkeeping over the router's `Instance` records: the caller stops the victims `tick` names.
It runs on the router's one event loop, so it needs no lock.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from slotserver.router.instance import LOADED, Instance


@dataclass
class Entry:
    model: str
    waiters: int = 1
    loading: bool = False   # one of its waiters is loading the model now (or has)


class LruSched:
    def __init__(self, instances: dict[str, Instance], models_max: int, stop: Callable[[str], None]):
        self.instances, self.models_max, self.stop = instances, models_max, stop
        self.queue: list[Entry] = []

    def n_running(self) -> int:
        return sum(1 for i in self.instances.values() if i.running)

    def has_capacity(self) -> bool:
        return self.models_max <= 0 or self.n_running() < self.models_max

    def find(self, model: str) -> Entry | None:
        return next((e for e in self.queue if e.model == model), None)

    def pick_victim(self) -> str | None:
        """The idle model used longest ago, or None when every running model must stay."""
        idle = [i for i in self.instances.values()
                if i.req_count == 0 and i.status == LOADED and not i.stopping and self.find(i.name) is None]
        return min(idle, key=lambda i: i.last_used).name if idle else None

    def join(self, model: str) -> None:
        if entry := self.find(model):
            entry.waiters += 1
        else:
            self.queue.append(Entry(model))

    def leave(self, model: str) -> None:
        if entry := self.find(model):
            entry.waiters -= 1
            if entry.waiters <= 0:
                self.queue.remove(entry)

    def try_claim(self, model: str) -> bool:
        """True when `model` heads the queue, nobody loads it yet and a slot is free: load it now."""
        if not self.queue or self.queue[0].model != model or self.queue[0].loading or not self.has_capacity():
            return False
        self.queue[0].loading = True
        return True

    def claim_failed(self, model: str) -> None:
        if entry := self.find(model):
            entry.loading = False   # back in line

    def tick(self) -> None:
        """Evict idle models while queued entries need more slots than are free or being freed."""
        if self.models_max <= 0 or not self.queue:
            return
        running = [i for i in self.instances.values() if i.running]
        n_stopping = sum(1 for i in running if i.stopping)
        n_needed = sum(1 for e in self.queue if not e.loading)
        n_claimed = sum(1 for e in self.queue if e.loading and not self._running(e.model))
        n_free = self.models_max - len(running) + n_stopping - n_claimed
        while n_free < n_needed:
            victim = self.pick_victim()
            if victim is None:
                return   # every model is busy: wait for a request to end
            self.stop(victim)
            n_free += 1

    def _running(self, model: str) -> bool:
        inst = self.instances.get(model)
        return inst is not None and inst.running
