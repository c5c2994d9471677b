"""ModelRouter: the models a router serves, their child processes, the load queue and eviction.

Everything runs on the router's event loop (no threads, no locks); a change of any model's state
wakes every waiter (`_changed`), which re-checks its condition, as llama-server's condition
variable does. The rules (who loads, who is evicted, who waits) are `LruSched`'s; this class runs
the processes and keeps `Instance` records, and `acquire`/`release` bracket each proxied request.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from dataclasses import dataclass
from typing import Awaitable, Callable

import httpx

from slotserver.router.catalog import ModelEntry, build_catalog
from slotserver.router.downloads import Downloads
from slotserver.router.child import Child, free_port
from slotserver.router.child_args import child_argv
from slotserver.router.config import RouterConfig
from slotserver.router.errors import RouterError
from slotserver.router.events import Events
from slotserver.router.instance import LOADED, LOADING, UNLOADED, Instance
from slotserver.router.preset_ini import Flags
from slotserver.router.sched import LruSched

log = logging.getLogger("slotserver.router")
FAKE_DELAY_S = 2.0      # LLAMA_SERVER_DEBUG_FAKE_TIMING, as llama-server
WAIT_POLL_S = 0.2       # how often a waiting request checks that its client is still there


@dataclass
class _Wait:
    """One waiting request's view: in the queue, has loaded the model, has seen it loading."""
    queued: bool = False
    did_load: bool = False
    saw_loading: bool = False


class ModelRouter:
    def __init__(self, config: RouterConfig, flags: Flags):
        self.config, self.flags = config, flags
        self.catalog: dict[str, ModelEntry] = build_catalog(config, flags)
        self.instances = {name: Instance(name) for name in self.catalog}
        self.sched = LruSched(self.instances, config.models_max, self.request_stop)
        self.events = Events()
        self.client = httpx.AsyncClient(timeout=httpx.Timeout(None, connect=10.0))
        self._changed = asyncio.Event()
        self._tasks: set[asyncio.Task] = set()
        self.n_waiting = 0   # requests waiting for their model (loading, or queued for a slot)
        self.downloads = Downloads(self)   # POST/DELETE /models (downloads.py)

    # ----- state changes and waiting
    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    async def wait_change(self, timeout: float = WAIT_POLL_S) -> None:
        try:
            await asyncio.wait_for(self._changed.wait(), timeout)
        except asyncio.TimeoutError:
            pass

    def _status(self, inst: Instance, status: str) -> None:
        inst.status = status
        self.events.publish("model_status", inst.name, {"status": status})
        self._notify()

    def spawn(self, coro: Awaitable) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def entry(self, name: str) -> ModelEntry:
        if not name:
            raise RouterError(400, "model name is missing from the request")
        if name not in self.catalog:
            raise RouterError(400, f"model '{name}' not found")
        return self.catalog[name]

    # ----- load and unload
    async def load(self, name: str) -> None:
        """Start `name`'s child (POST /models/load, or a queued request's turn); evicts the LRU idle
        model first when --models-max is reached; returns once spawned (status loading)."""
        if self.config.fake_timing:
            await asyncio.sleep(FAKE_DELAY_S)
        entry = self.entry(name)
        if entry.error:
            raise RouterError(400, entry.error)
        if name in self.downloads.removing:
            raise RouterError(400, f"model name={name} is being removed")
        await self._unload_lru()
        inst = self.instances[name]
        if inst.status != UNLOADED or inst.stopping:
            return
        if not self.sched.has_capacity():
            raise RouterError(500, "model limit reached, try again later")
        port = free_port()
        argv = child_argv(entry, self.config, self.flags, port)
        # the router read llama-server's LLAMA_ARG_* / LLAMA_API_KEY into its own flags (cli/llama_env.py) and
        # passes a child the ones it does not own: the child must not read the reserved ones (host, port, key)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("LLAMA_ARG_", "LLAMA_API_KEY"))}
        if self.config.models_cache is not None:   # a child's -hf downloads where the router lists the cache
            env["LLAMA_CACHE"] = str(self.config.models_cache)
        env |= self.config.extra_env
        child = Child(name, argv, port, env)
        inst.child, inst.args, inst.info = child, tuple(argv), None
        inst.exit_code, inst.failed, inst.last_used = None, False, time.monotonic()
        self._status(inst, LOADING)
        log.info("router: loading %s on port %d", name, port)
        try:
            await child.start()
        except OSError as e:
            inst.child, inst.failed = None, True
            self._status(inst, UNLOADED)
            raise RouterError(500, f"failed to start the server for '{name}': {e}") from None
        self.spawn(self._watch(inst, child))

    async def _watch(self, inst: Instance, child: Child) -> None:
        if await child.wait_healthy(self.client) and inst.child is child and inst.status == LOADING:
            inst.info = await child.info(self.client)
            self._status(inst, LOADED)
            log.info("router: %s loaded", inst.name)
        code = await child.wait()
        if inst.child is not child:
            return
        inst.child, inst.exit_code = None, code
        inst.failed = code != 0 and not inst.stopping   # llama-server: unloaded with a non-zero exit
        inst.stopping = False
        self._status(inst, UNLOADED)
        log.info("router: %s exited with status %d", inst.name, code)
        self.sched.tick()

    async def _unload_lru(self) -> None:
        if self.sched.has_capacity():
            return
        victim = self.sched.pick_victim()
        if victim is None:
            return
        log.info("router: --models-max reached, unloading the least recently used %s", victim)
        self.request_stop(victim)
        while self.instances[victim].status != UNLOADED:
            await self.wait_change(WAIT_POLL_S)

    def request_stop(self, name: str) -> None:
        """Ask `name`'s child to exit (it takes no new request from now); a loading one is killed."""
        inst = self.instances.get(name)
        if inst is None or inst.child is None or inst.stopping:
            return
        inst.stopping = True
        if inst.status == LOADING:
            inst.child.kill()
        else:
            self.spawn(inst.child.stop(self.catalog[name].stop_timeout if name in self.catalog else 10.0))
        self._notify()

    async def stop_all(self) -> None:
        self.downloads.stop()
        for name in list(self.instances):
            self.request_stop(name)
        while any(i.running for i in self.instances.values()):
            await self.wait_change(WAIT_POLL_S)
        await self.client.aclose()

    # ----- requests
    async def acquire(self, name: str, autoload: bool, gone: Callable[[], Awaitable[bool]]) -> Child:
        """Wait until `name` serves (loading it if allowed) and count a request on it; pair with
        `release`. `gone()` says the client left: a waiting request then gives up its place."""
        entry = self.entry(name)
        inst = self.instances[name]
        if entry.error:
            raise RouterError(400, entry.error)
        if name in self.downloads.removing:
            raise RouterError(400, f"model name={name} is being removed")
        if not autoload and not inst.running:
            raise RouterError(400, "model is not loaded")
        if not inst.ready:
            if self.n_waiting >= self.config.max_queue:
                raise RouterError(503, f"{self.n_waiting} requests already wait for a model (--max-queue)")
            self.n_waiting += 1
            try:
                await self._ensure_ready(inst, gone)
            finally:
                self.n_waiting -= 1
        if inst.child is None or inst.status not in (LOADED, LOADING):
            raise RouterError(400, f"model name={name} is not running")
        inst.req_count += 1   # no await since the wait ended: nothing can evict it in between
        inst.last_used = time.monotonic()
        if self.config.fake_timing:
            await asyncio.sleep(FAKE_DELAY_S)
        return inst.child

    def release(self, name: str) -> None:
        inst = self.instances.get(name)
        if inst is not None and inst.req_count > 0:
            inst.req_count -= 1
            if inst.req_count == 0:
                self.sched.tick()
                self._notify()

    async def _ensure_ready(self, inst: Instance, gone: Callable[[], Awaitable[bool]]) -> None:
        """llama-server's ensure_model_ready: queue, load at the head of the queue, wait for loaded."""
        w = _Wait()
        try:
            while not self._settled(inst, w):
                if await gone():
                    raise RouterError(400, f"request cancelled while waiting for model name={inst.name}")
                if inst.status == UNLOADED and not inst.stopping and self.sched.try_claim(inst.name):
                    w.did_load = await self._load_claimed(inst.name) or w.did_load
                    continue
                await self.wait_change(WAIT_POLL_S)
        except BaseException:
            if w.queued:
                self.sched.leave(inst.name)
                self.sched.tick()   # a slot freed for this waiter goes to the next one
                self._notify()
            raise
        if w.queued:   # no tick here: the caller counts its request before anything else runs
            self.sched.leave(inst.name)
            self._notify()

    def _settled(self, inst: Instance, w: "_Wait") -> bool:
        """One look at the model for a waiting request: True when the wait is over (loaded, or down
        again after a spawn); joins the queue when the model needs a load or is on its way out."""
        if self.instances.get(inst.name) is not inst:
            return True   # a reload removed the model: the caller answers "not running"
        if not w.queued and (inst.stopping or (inst.status == UNLOADED and not (w.did_load or w.saw_loading))):
            self.sched.join(inst.name)   # the queue entry also keeps the model safe from eviction
            w.queued = True
            self.sched.tick()
        if inst.stopping:
            return False   # a stopping instance takes no new request: the next one serves it
        if inst.status == LOADING:
            w.saw_loading = True
            return False
        if inst.status == UNLOADED and (w.did_load or w.saw_loading):
            if inst.failed:
                raise RouterError(500, f"model name={inst.name} failed to load")
            return True   # unloaded by another code path: the caller answers "not running"
        return inst.status == LOADED

    async def _load_claimed(self, name: str) -> bool:
        """This waiter's turn: load; on failure (a race for the slot) stay in line."""
        try:
            await self.load(name)
            ok = True
        except RouterError as e:
            log.warning("router: queued load of %s did not go through: %s", name, e.message)
            self.sched.claim_failed(name)
            ok = False
        self.sched.tick()
        return ok

    # ----- the list
    async def reload(self) -> None:
        """GET /models?reload=1: read the sources again. A running model whose entry changed or
        went away is unloaded; the others are added or updated (llama-server's rules)."""
        fresh = build_catalog(self.config, self.flags)
        for name, inst in list(self.instances.items()):
            old, new = self.catalog.get(name), fresh.get(name)
            if inst.running and (new is None or old is None or new.fingerprint() != old.fingerprint()):
                self.request_stop(name)
            if new is None and not inst.running:
                del self.instances[name]
                self.events.publish("model_remove", name)
        for name in fresh:
            self.instances.setdefault(name, Instance(name))
        self.catalog = {**{n: e for n, e in self.catalog.items() if n in self.instances}, **fresh}
        self.events.publish("models_reload", "*")
        self._notify()

    async def load_startup_models(self) -> None:
        for entry in self.catalog.values():
            if entry.load_on_startup and not entry.error:
                try:
                    await self.load(entry.name)
                except RouterError as e:
                    log.warning("router: load-on-startup %s: %s", entry.name, e.message)
