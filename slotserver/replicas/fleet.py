"""Fleet: the set of replicas, kept current by polling (health checks, /slots, the upstreams file).

Every `health_interval` seconds each replica's `/health` is read: 200 puts it in rotation, anything
else (503 "Loading model", a refused connection, a timeout) drains it: no new request is routed
there, the requests already open finish or fail on their own. A replica that fails is also drained
at once by the proxy (a passive check), without waiting for the next poll. Its prefix entries are
dropped, because a replica that comes back has most likely restarted with an empty cache.

`/slots` gives the slot count and how many are busy (the load from other clients too); its
cumulative prompt-cache counters going back means the replica restarted between two polls, which
drops its prefix entries too. A replica without /slots (`--no-slots`, a key we lack) still serves;
its load is then only this router's in-flight count.

With --upstreams-file the file is re-read when its modification time changes: new URLs join (after
their first good health check), removed ones leave once their open requests are done.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import httpx

from slotserver.replicas.affinity import AffinityTable
from slotserver.replicas.config import RouterConfig, RouterConfigError, read_upstreams_file
from slotserver.replicas.replica import Replica

log = logging.getLogger("slotserver.replicas")


class Fleet:
    def __init__(self, config: RouterConfig, table: AffinityTable) -> None:
        self.config, self.table = config, table
        self.replicas: dict[str, Replica] = {u: Replica(u) for u in config.initial_upstreams()}
        self._file_mtime = self._mtime()
        headers = {"Authorization": f"Bearer {config.upstream_api_key}"} if config.upstream_api_key else {}
        self.http = httpx.AsyncClient(headers=headers, timeout=config.health_timeout)

    def healthy(self) -> list[Replica]:
        return [r for r in self.replicas.values() if r.healthy and not r.leaving]

    def drain(self, r: Replica, why: str) -> None:
        """Take `r` out of rotation now and forget what it held."""
        if r.healthy:
            log.warning("replica %s drained: %s", r.url, why)
        r.healthy, r.status = False, f"down: {why}"
        self.table.forget(r.url)

    async def poll_forever(self) -> None:
        while True:
            await self.poll_once()
            await asyncio.sleep(self.config.health_interval)

    async def poll_once(self) -> None:
        self._reload_file()
        for url in [u for u, r in self.replicas.items() if r.leaving and r.inflight == 0]:
            del self.replicas[url]
        await asyncio.gather(*(self._check(r) for r in list(self.replicas.values()) if not r.leaving))

    async def _check(self, r: Replica) -> None:
        try:
            resp = await self.http.get(r.url + "/health")
        except httpx.HTTPError as e:
            self.drain(r, type(e).__name__)
            return
        if resp.status_code != 200:
            self.drain(r, "loading" if resp.status_code == 503 else f"/health answered {resp.status_code}")
            r.status = "loading" if resp.status_code == 503 else r.status
            return
        if not r.healthy:
            log.info("replica %s in rotation", r.url)
        r.healthy, r.status = True, "ok"
        await self._read_slots(r)

    async def _read_slots(self, r: Replica) -> None:
        try:
            resp = await self.http.get(r.url + "/slots")
            slots = resp.json() if resp.status_code == 200 else None
        except (httpx.HTTPError, ValueError):
            slots = None
        if not isinstance(slots, list) or not all(isinstance(s, dict) for s in slots):
            r.n_slots, r.busy_slots = None, 0
            return
        r.n_slots = len(slots)
        r.busy_slots = sum(1 for s in slots if s.get("is_processing"))
        seen = sum(_cache_count(s) for s in slots)
        if seen < r.cache_seen:   # cumulative counters went back: a restart, its cache is empty
            log.info("replica %s restarted: its prefixes are forgotten", r.url)
            self.table.forget(r.url)
        r.cache_seen = seen

    def _mtime(self) -> float | None:
        path = self.config.upstreams_file
        try:
            return path.stat().st_mtime if path is not None else None
        except OSError:
            return None

    def _reload_file(self) -> None:
        path: Path | None = self.config.upstreams_file
        mtime = self._mtime()
        if path is None or mtime is None or mtime == self._file_mtime:
            return
        self._file_mtime = mtime
        try:
            urls = list(self.config.upstreams) + read_upstreams_file(path)
        except RouterConfigError as e:
            log.error("upstreams file not applied: %s", e)   # keep serving with the current set
            return
        for url in urls:
            self.replicas.setdefault(url, Replica(url)).leaving = False
        for url in [u for u in self.replicas if u not in urls]:
            self.replicas[url].leaving = True
            self.table.forget(url)
        log.info("upstreams file re-read: %d replicas", len(self.replicas))

    async def close(self) -> None:
        await self.http.aclose()


def _cache_count(slot: dict) -> int:
    pc = slot.get("prompt_cache")
    if not isinstance(pc, dict):
        return 0
    return sum(v for v in (pc.get("n_cached"), pc.get("n_computed")) if isinstance(v, int))
