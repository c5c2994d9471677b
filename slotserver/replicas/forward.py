"""The catch-all ASGI endpoint: every path the router does not answer itself goes to a replica.

It reads the body (bounded), computes the prompt's routing key, asks the policy for a replica,
and tries up to `retries` other replicas while nothing was streamed yet (proxy.Attempt). The whole
forward runs as a task beside a watcher of the client's connection: a disconnect cancels it, and
the cancelled attempt closes its upstream request.
"""

from __future__ import annotations

import asyncio
import json
import logging

import httpx

from slotserver.replicas.fleet import Fleet
from slotserver.replicas.policy import Decision, Policy
from slotserver.replicas.prefix import PromptKey, canonical_text
from slotserver.replicas.proxy import (RETRY_ERRORS, Attempt, PayloadTooLarge, error_body, read_body, send_json,
                                     upstream_request)
from slotserver.replicas.stats import RouterStats

log = logging.getLogger("slotserver.replicas")


class Forwarder:
    def __init__(self, fleet: Fleet, policy: Policy, stats: RouterStats, client: httpx.AsyncClient) -> None:
        self.fleet, self.policy, self.stats, self.client = fleet, policy, stats, client

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return   # websockets: nothing the replicas speak
        try:
            body = await read_body(receive, self.fleet.config.body_limit)
        except PayloadTooLarge:
            await send_json(send, 413, error_body(413, "request body too large", "invalid_request_error"))
            return
        except asyncio.CancelledError:
            return   # the client left while sending its request
        started = []

        async def tracked_send(message) -> None:
            started.append(True)
            await send(message)

        task = asyncio.create_task(self.forward(scope, body, tracked_send))
        watch = asyncio.create_task(_disconnected(receive))
        await asyncio.wait({task, watch}, return_when=asyncio.FIRST_COMPLETED)
        if not task.done():
            self.stats.disconnects += 1
            task.cancel()
        watch.cancel()
        result, _ = await asyncio.gather(task, watch, return_exceptions=True)
        if isinstance(result, Exception):   # a bug of ours, never the client's fault: say so, keep serving
            log.error("forwarding %s %s failed", scope["method"], scope["path"], exc_info=result)
            if not started:
                await send_json(send, 500, error_body(500, f"router error: {type(result).__name__}", "server_error"))

    def key(self, body: bytes) -> PromptKey | None:
        """The prompt's routing key (None: no prompt in the body)."""
        try:
            text = canonical_text(json.loads(body)) if body else ""
        except (ValueError, UnicodeDecodeError):
            text = ""   # not JSON: the replica will say what is wrong with it
        return PromptKey.of(text, self.fleet.config.block_bytes, self.fleet.config.hash_blocks)

    def _another(self, tried: set[str]) -> bool:
        return any(r.url not in tried for r in self.fleet.healthy())

    async def forward(self, scope, body: bytes, send) -> None:
        """Up to 1 + retries replicas, each tried once, until one answers."""
        key = self.key(body)
        tried: set[str] = set()
        last_error = None
        for _ in range(self.fleet.config.retries + 1):
            decision = self.policy.choose(self.fleet.healthy(), key, tried)
            if decision is None:
                break
            tried.add(decision.replica.url)
            self.stats.count(decision)
            self.policy.sent(decision, key)
            may_retry = len(tried) <= self.fleet.config.retries and self._another(tried)
            last_error = await self._try(decision, scope, body, send, may_retry)
            if last_error is None:
                return
            self.stats.retries += 1
        code = 502 if last_error else 503
        await send_json(send, code, error_body(code, last_error or "no replica is healthy", "unavailable_error"))

    async def _try(self, decision: Decision, scope, body: bytes, send, may_retry: bool) -> str | None:
        """One attempt: None once the client was answered, else why another replica should try."""
        r = decision.replica
        attempt = Attempt(self.client, decision)
        r.inflight += 1
        try:
            try:
                status = await attempt.open(upstream_request(self.client, scope, r.url, body))
            except RETRY_ERRORS as e:
                r.failures += 1
                self.fleet.drain(r, f"{type(e).__name__} on a request")
                return f"replica {r.name} failed: {type(e).__name__}"
            if status == 503 and may_retry:
                return f"replica {r.name} answered 503"   # busy or loading: another may answer
            if not await attempt.pump(send):
                self.stats.cut += 1
            return None
        finally:
            r.inflight -= 1
            await attempt.close()


async def _disconnected(receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
