"""llama-server's router download API over slotserver/hub/: POST /models {"model": "USER/REPO[:QUANT]"}
downloads a model into --models-cache, DELETE /models?model=NAME removes a cached one.

POST checks the reference against the hub's listing first (a bad one, a quant the repository
lacks, a gated repository: a 400 at once), refuses a name already listed, then downloads in the
background: /models lists the name with status `downloading` meanwhile, with its `progress` (bytes
done and total per file); /models/sse sends `download_progress` events as it grows, then
`download_finished` (the cache is read again, so the model is listed under its cache name,
USER/REPO:QUANT) or `download_failed` with the reason. DELETE stops the model if it runs, then
deletes its files as llama.cpp does (hub/cache.py `remove`): a cache model only, as there.
The download runs in a child process (hub/download_child.py), as llama-server's router downloads in
a child: DELETE of a download in flight, or stopping the router, terminates it at once (the partial
file stays in the cache's blobs, and huggingface_hub resumes it if the model is asked for again;
DELETE then removes what the cache lists of it). A model being deleted cannot be loaded
(`removing`, which ModelRouter.load checks), so a queued request cannot revive it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

from slotserver.errors import ConfigError
from slotserver.router.errors import RouterError
from slotserver.router.instance import UNLOADED
from slotserver.router.listing import entry_json

if TYPE_CHECKING:
    from slotserver.router.models import ModelRouter

log = logging.getLogger("slotserver.router")
DOWNLOADING = "downloading"


class Downloads:
    def __init__(self, router: "ModelRouter") -> None:
        self.router = router
        self.active: dict[str, bool] = {}   # name -> deleted while downloading
        self.children: dict[str, asyncio.subprocess.Process] = {}   # name -> its download's process
        self.cancelled: set[str] = set()     # downloads stopped (DELETE, unload), maybe before their process started
        self.progress: dict[str, dict[str, dict[str, int]]] = {}   # name -> file -> {done, total} bytes
        self.removing: set[str] = set()      # cache models being deleted: not loadable (models.py load)

    def _cache(self) -> Path:
        where = self.router.config.models_cache
        if where is None:
            raise RouterError(400, "downloads go into the models cache: start the router with --models-cache DIR")
        return where

    async def start(self, ref: str) -> None:
        """POST /models: check `ref`, then download it in the background."""
        from slotserver.hub.download import choose, offline_env

        where = self._cache()
        if self.router.config.offline or offline_env():
            raise RouterError(400, "the router runs offline (--offline or HF_HUB_OFFLINE): POST /models downloads "
                                   "nothing; the models cache serves what it holds")
        if ref in self.router.catalog or ref in self.active:
            raise RouterError(400, f"model '{ref}' already exists")
        token = self.router.config.extra_env.get("HF_TOKEN")
        self.active[ref] = False   # reserved before the first await: a second POST is refused
        try:
            name = await _in_thread(choose, ref, token)
        except BaseException as e:   # a bad reference, a missing quant, a gated repository, the hub, a cancel
            self.active.pop(ref, None)
            self.cancelled.discard(ref)
            if not isinstance(e, Exception):
                raise
            why = str(e) if isinstance(e, ConfigError) else f"model '{ref}' could not be checked on the hub: {e}"
            raise RouterError(400, why) from None
        log.info("router: downloading %s (%s) into %s", ref, name, where)
        self.router.events.publish("model_status", ref, {"status": DOWNLOADING})
        self.router.spawn(self._run(ref, name, token, where))

    async def _run(self, ref: str, name: str, token: str | None, where: Path) -> None:
        """Download the file `start` chose (no second listing, so no other file) in a child process,
        then say how it went. Whatever happens, the name leaves `active` and `cancelled` at the end."""
        from slotserver.hub.download import check_ref

        started = time.time()
        try:
            failed = "cancelled" if ref in self.cancelled else await self._child(ref, check_ref(ref)[0], name, token,
                                                                                 where)
        except OSError as e:   # the child could not start
            failed = f"the download could not start: {e}"
        except Exception as e:   # a line the child should never write (over the stream's limit, not JSON objects)
            failed = f"the download failed: {e}"
        if failed and ref in self.cancelled:   # (a download that completed before its cancel stays done)
            failed = "cancelled"
        self.progress.pop(ref, None)
        try:
            await self._settle(ref, failed, where, started)
        except (ConfigError, OSError) as e:   # an edited preset file gone bad, a cache not writable
            log.warning("router: after downloading %s: %s", ref, e)

    async def _settle(self, ref: str, failed: str | None, where: Path, started: float) -> None:
        """A download ended: its files removed if it was deleted meanwhile (listed until they are gone),
        its events, the catalog read again."""
        from slotserver.hub import cache
        from slotserver.hub.download import check_ref

        deleted = self.active.get(ref, False)
        try:
            if deleted:   # its files, a partial one too
                await _in_thread(cache.remove, where, ref)
                repo = check_ref(ref)[0]
                if not any(check_ref(other)[0] == repo for other in self.active if other != ref):
                    await _in_thread(cache.remove_partial, where, repo, started)
        finally:
            self.active.pop(ref, None)
            self.cancelled.discard(ref)
        if deleted:
            self.router.events.publish("model_remove", ref)
        elif failed:
            log.warning("router: downloading %s failed: %s", ref, failed)
            self.router.events.publish("download_failed", ref, {"error": failed})
        else:
            self.router.events.publish("download_finished", ref)
        await self.router.reload()

    async def _child(self, ref: str, repo: str, name: str, token: str | None, where: Path) -> str | None:
        """hub/download_child.py for `name`, its progress lines reported -> None, or why it failed. The
        process never outlives this call (killed if its output breaks the reading)."""
        env = dict(os.environ, **({"HF_TOKEN": token} if token else {}))
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "slotserver.hub.download_child", repo, name, str(where),
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env)
        self.children[ref] = proc
        if ref in self.cancelled:   # stopped while its process was starting
            proc.terminate()
        error, stderr = None, asyncio.ensure_future(proc.stderr.read())
        try:
            async for line in proc.stdout:
                try:
                    msg = json.loads(line)
                except ValueError:
                    continue
                if not isinstance(msg, dict):
                    continue
                if "file" in msg:
                    self._progress(ref, str(msg["file"]), int(msg["done"]), int(msg["total"]))
                error = msg.get("error", error)
            code = await proc.wait()
            last = (await stderr).decode("utf-8", "replace").strip().splitlines()[-1:]   # a crash's last line
        finally:
            self.children.pop(ref, None)
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
            stderr.cancel()
        if code == 0:
            return None
        return error or f"the download process ended with code {code}" + (f": {last[0][:200]}" if last else "")

    def _progress(self, ref: str, file: str, done: int, total: int) -> None:
        """llama-server's download_progress event: {"progress": {FILE: {"done", "total"}}} (bytes)."""
        if ref in self.active:
            self.progress.setdefault(ref, {})[file] = {"done": done, "total": total}
            self.router.events.publish("download_progress", ref, {"progress": dict(self.progress[ref])})

    async def remove(self, name: str) -> None:
        """DELETE /models?model=NAME: a cache model's files (the model stopped first)."""
        from slotserver.hub import cache

        where = self._cache()
        if name in self.active:   # in flight: its process stopped now, its files go when _run sees it end
            self.cancel(name, delete=True)
            return
        entry = self.router.catalog.get(name)
        if entry is None:
            raise RouterError(400, f"model name={name} is not found")
        if entry.source != "cache":
            raise RouterError(400, f"model name={name} is not removable (not from cache)")
        self.removing.add(name)   # load() refuses it from now on, whatever a reload does meanwhile
        try:
            while (inst := self.router.instances.get(name)) is not None and inst.status != UNLOADED:
                self.router.request_stop(name)
                await self.router.wait_change()
            await _in_thread(cache.remove, where, name)
        except OSError as e:
            raise RouterError(500, f"model name={name}: its files could not be deleted: {e}") from None
        finally:
            self.removing.discard(name)
        log.info("router: removed %s from %s", name, where)
        try:
            await self.router.reload()   # it drops the entry (and says model_remove)
        except ConfigError as e:
            log.warning("router: after removing %s: %s", name, e)

    def cancel(self, name: str, delete: bool = False) -> None:
        """Stop the download of `name` now (POST /models/unload, as llama-server's router; DELETE with
        `delete`: its files are removed once its process has ended)."""
        if name not in self.active:
            return
        self.cancelled.add(name)   # seen by _run / _child if its process has not started yet
        if delete:
            self.active[name] = True
        if (proc := self.children.get(name)) is not None and proc.returncode is None:
            proc.terminate()

    def stop(self) -> None:
        """The router stops: every download's process with it (a partial file stays, resumable),
        and any not started yet never starts."""
        for name in list(self.active):
            self.cancel(name)

    def listing(self) -> list[dict]:
        """The downloads in flight as /models entries (llama-server lists them so)."""
        created = int(time.time())
        return [entry_json(name, {"value": DOWNLOADING, "args": []}, None, "cache", created)
                | {"progress": self.progress.get(name, {})}
                for name in self.active if name not in self.router.catalog]


async def _in_thread(fn, *args):
    """fn(*args) on a daemon thread, awaited: unlike asyncio.to_thread's pool, the process does not
    wait for it at exit (a hub listing may take its whole timeout; the downloads themselves run in
    child processes, `_child`)."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future = loop.create_future()

    def settle(result, error) -> None:
        if not done.done():
            done.set_exception(error) if error is not None else done.set_result(result)

    def run() -> None:
        try:
            result, error = fn(*args), None
        except BaseException as e:   # handed to the awaiting coroutine
            result, error = None, e
        try:
            loop.call_soon_threadsafe(settle, result, error)
        except RuntimeError:   # the loop closed meanwhile: nobody waits any more
            pass

    threading.Thread(target=run, daemon=True, name="hub").start()
    return await done
