"""The replica router's ASGI app: its own /health, /metrics and /router/replicas; the rest forwarded.

`/health` answers 200 `{"status": "ok"}` while at least one replica is in rotation and 503 (as a
loading llama-server does) while none is, so a load balancer in front of several routers treats
the router as it would a server. `/metrics` merges the replicas' (aggregate.py) and adds the
router's counters. `/router/replicas` shows each replica's state, load and routing counts.
Everything else, `/v1/models` and `/props` included, is forwarded to a replica: they all serve the
same model, so any healthy one answers for the fleet.
"""

from __future__ import annotations

import asyncio
import contextlib

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Mount, Route

from slotserver.replicas.affinity import AffinityTable
from slotserver.replicas.aggregate import merge
from slotserver.replicas.config import RouterConfig
from slotserver.replicas.fleet import Fleet
from slotserver.replicas.forward import Forwarder
from slotserver.replicas.policy import Policy
from slotserver.replicas.proxy import upstream_request
from slotserver.replicas.stats import RouterStats


class Router:
    """The parts, built from the config; `app` is what uvicorn serves."""

    def __init__(self, config: RouterConfig) -> None:
        self.config = config
        self.table = AffinityTable(config.table_size)
        self.fleet = Fleet(config, self.table)
        self.policy = Policy(config.policy, self.table, config.balance_slack)
        self.stats = RouterStats()
        timeout = httpx.Timeout(connect=config.connect_timeout, read=config.read_timeout, write=config.read_timeout,
                                pool=None)
        self.client = httpx.AsyncClient(timeout=timeout, limits=httpx.Limits(max_connections=None,
                                                                             max_keepalive_connections=64))
        routes = [Route("/health", self.health), Route("/metrics", self.metrics),
                  Route("/router/replicas", self.replicas), Route("/lora-adapters", self.set_lora, methods=["POST"]),
                  Mount("", app=Forwarder(self.fleet, self.policy, self.stats, self.client))]
        self.app = Starlette(routes=routes, lifespan=self.lifespan)

    @contextlib.asynccontextmanager
    async def lifespan(self, app):
        await self.fleet.poll_once()   # know who is up before the first request
        poller = asyncio.create_task(self.fleet.poll_forever())
        try:
            yield
        finally:
            poller.cancel()
            await asyncio.gather(poller, return_exceptions=True)
            await self.client.aclose()
            await self.fleet.close()

    async def health(self, request: Request):
        n = len(self.fleet.healthy())
        if n == 0:
            return JSONResponse({"error": {"code": 503, "message": "no replica is healthy",
                                           "type": "unavailable_error"}}, status_code=503)
        return JSONResponse({"status": "ok", "replicas_healthy": n, "replicas": len(self.fleet.replicas)})

    async def metrics(self, request: Request):
        replicas = list(self.fleet.replicas.values())
        texts = await asyncio.gather(*(self._scrape(r.url) for r in replicas if r.healthy))
        merged = merge({r.name: t for r, t in zip([r for r in replicas if r.healthy], texts) if t is not None})
        return PlainTextResponse(merged + self.stats.prometheus(replicas),
                                 media_type="text/plain; version=0.0.4")

    async def _scrape(self, url: str) -> str | None:
        try:
            resp = await self.fleet.http.get(url + "/metrics")
        except httpx.HTTPError:
            return None
        return resp.text if resp.status_code == 200 else None

    async def set_lora(self, request: Request):
        """POST /lora-adapters to every replica, not one: they serve one model, so the adapter scales
        are the fleet's. 200 when every replica took them; else the first refusal as the replica gave
        it (each checks the body alike, so a 400 changes none), or a 502 naming the replicas that
        could not be reached (the others took the new scales). GET is forwarded to one, as any path."""
        body, replicas = await request.body(), list(self.fleet.replicas.values())

        async def post(r) -> tuple[int | None, bytes]:
            try:
                resp = await self.client.send(upstream_request(self.client, request.scope, r.url, body))
                return resp.status_code, resp.content
            except httpx.HTTPError as e:
                return None, str(e).encode()
        answers = await asyncio.gather(*(post(r) for r in replicas))
        for status, content in answers:
            if status is not None and status != 200:
                return Response(content, status_code=status, media_type="application/json")
        down = [r.name for r, (status, _) in zip(replicas, answers) if status is None]
        if down:
            return JSONResponse({"error": {"code": 502, "type": "server_error", "message": "POST /lora-adapters: "
                                           f"{', '.join(down)} could not be reached; the other replicas took the scales"}},
                                status_code=502)
        return JSONResponse({"success": True})

    async def replicas(self, request: Request):
        return JSONResponse({"policy": self.config.policy, "table_blocks": len(self.table),
                             "routed": self.stats.by_reason(), "retries": self.stats.retries,
                             "replicas": [r.snapshot() for r in self.fleet.replicas.values()]})
