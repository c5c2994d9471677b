"""llama-server's router download API over slotserver/hub/: POST /models {"model": "USER/REPO[:QUANT]"}
downloads a model into --models-cache, DELETE /models?model=NAME removes a cached one.

POST checks the reference against the hub's listing first (a bad one, a quant the repository
lacks, a gated repository: a 400 at once), refuses a name already listed, then downloads in the
background: /models lists the name with status `downloading` meanwhile, and /models/sse says
`download_finished` (the cache is read again, so the model is listed under its cache name,
USER/REPO:QUANT) or `download_failed` with the reason. DELETE stops the model if it runs, then
deletes its files as llama.cpp does (hub/cache.py `remove`): a cache model only, as there. A
download in flight cannot be interrupted here (huggingface_hub's call runs to its end): deleting it
makes its files go as soon as it finishes.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import TYPE_CHECKING

from slotserver.errors import ConfigError
from slotserver.router.errors import RouterError
from slotserver.router.instance import UNLOADED

if TYPE_CHECKING:
    from slotserver.router.models import ModelRouter

log = logging.getLogger("slotserver.router")
DOWNLOADING = "downloading"


class Downloads:
    def __init__(self, router: "ModelRouter") -> None:
        self.router = router
        self.active: dict[str, bool] = {}   # name -> deleted while downloading

    def _cache(self) -> Path:
        where = self.router.config.models_cache
        if where is None:
            raise RouterError(400, "downloads go into the models cache: start the router with --models-cache DIR")
        return where

    async def start(self, ref: str) -> None:
        """POST /models: check `ref`, then download it in the background."""
        from slotserver.hub.download import choose

        where = self._cache()
        if ref in self.router.catalog or ref in self.active:
            raise RouterError(400, f"model '{ref}' already exists")
        token = self.router.config.extra_env.get("HF_TOKEN")
        try:
            name = await asyncio.to_thread(choose, ref, token)
        except ConfigError as e:
            raise RouterError(400, str(e)) from None
        except Exception as e:   # the hub unreachable
            raise RouterError(400, f"model '{ref}' could not be checked on the hub: {e}") from None
        self.active[ref] = False
        log.info("router: downloading %s (%s) into %s", ref, name, where)
        self.router.events.publish("model_status", ref, {"status": DOWNLOADING})
        self.router.spawn(self._run(ref, token, where))

    async def _run(self, ref: str, token: str | None, where: Path) -> None:
        from slotserver.hub import cache
        from slotserver.hub.download import fetch

        try:
            await asyncio.to_thread(fetch, ref, None, token, False, where)
            failed = None
        except Exception as e:
            failed = str(e) or type(e).__name__
        deleted = self.active.pop(ref, False)
        if deleted:
            await asyncio.to_thread(cache.remove, where, ref)
            self.router.events.publish("model_remove", ref)
        elif failed:
            log.warning("router: downloading %s failed: %s", ref, failed)
            self.router.events.publish("download_failed", ref, {"error": failed})
        else:
            self.router.events.publish("download_finished", ref)
        await self.router.reload()

    async def remove(self, name: str) -> None:
        """DELETE /models?model=NAME: a cache model's files (the model stopped first)."""
        from slotserver.hub import cache

        where = self._cache()
        if name in self.active:
            self.active[name] = True
            return
        entry = self.router.catalog.get(name)
        if entry is None:
            raise RouterError(400, f"model name={name} is not found")
        if entry.source != "cache":
            raise RouterError(400, f"model name={name} is not removable (not from cache)")
        self.router.request_stop(name)
        while self.router.instances[name].status != UNLOADED:
            await self.router.wait_change()
        await asyncio.to_thread(cache.remove, where, name)
        log.info("router: removed %s from %s", name, where)
        await self.router.reload()

    def listing(self) -> list[dict]:
        """The downloads in flight as /models entries (llama-server lists them so)."""
        return [{"id": name, "aliases": [], "tags": [], "object": "model", "owned_by": "llamacpp", "path": None,
                 "status": {"value": DOWNLOADING, "args": []}, "source": "cache", "can_remove": True}
                for name in self.active]
