"""Rank 0 of `--tp N`: sends each step, and every KV-cache edit, to the other ranks.

The engine (or `generate`) on rank 0 runs as without TP; two hooks make the other ranks follow:
`LlamaModel.step_hook` sends the Batch of each forward before rank 0 runs it (every rank then runs
the same forward on its shard; the collectives inside keep them in step), and `LeaderCache`
stands in for the engine's `KVCache`, sending each edit made between forwards (defrag moves and
trims, n > 1 forks, context-shift and cache-reuse shifts, slot restores, sleep) before making it
on rank 0's own heads. Reads stay local (`view`, `budget`, `bytes_used`), except `export_stream`,
which gathers every rank's heads: a slot file or a prompt-cache entry holds the whole K/V, the
same bytes as without TP. `import_stream` sends the whole K/V and each rank keeps its heads.

The messages (worker.py applies them): ("cache", layout version, Source or None, KVSpec) makes
the cache the next ones act on; ("forward", Batch); ("op", method, args); ("export", stream, n);
("import", stream, k, v); ("kernels", [(op, version, Source or None)]): a lab kernel swap;
("layout", version, Source or None, [(stream, n)]): a lab layout swap; ("report",); ("stop",).
Both swaps are then agreed on (`Comm.all_or_none`: a gather of each rank's failure, rank 0's
verdict), so every rank serves the new modules from the same step on, or none does.

Why layouts travel as bytes, never as a path: what a rank serves must be what rank 0's lab
validated, and the file may have been saved again since (or, under torchrun, not be the same file
on another node). Rank 0 records which layout versions the other ranks hold (each keeps every one
it was sent), so a rollback to one sends its version only.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from slotserver.engine.kv_cache import KVCache
from slotserver.errors import ModuleLoadError
from slotserver.runtime.loader import LoadedModule, Source, read_source
from slotserver.parallel.comm import Comm
from slotserver.parallel.shard import ShardPlan


class Leader:
    def __init__(self, comm: Comm, plan: ShardPlan) -> None:
        self.comm, self.plan = comm, plan
        self.current: KVCache | None = None   # the cache the other ranks mirror
        self.layouts: set[str] = set()        # layout versions every other rank holds

    def attach(self, model) -> None:
        model.step_hook = self.step

    def step(self, batch, cache) -> None:
        self.use(getattr(cache, "inner", cache))
        self.comm.send(("forward", batch))

    def use(self, cache: KVCache) -> None:
        """Make `cache` the one the other ranks mirror (each builds its own, of its own heads)."""
        if cache is not self.current:
            loaded = cache.loaded
            self.comm.send(("cache", loaded.version, self._layout_bytes(loaded), cache.spec))
            self.layouts.add(loaded.version)
            self.current = cache

    def stop(self) -> None:
        self.comm.send(("stop",))

    def swap_kernels(self, old, new) -> None:
        """A lab kernel swap (EnginePort.kernel_hook), made on every rank between the same two steps,
        or on none (ModuleLoadError: rank 0 keeps `old` too): each changed op's (version, file bytes).
        A version a rank has served before (a rollback to it) is taken from its own record; the
        bytes are read again from the module's file and sent only if they still have that version
        (the lab validated those bytes: a file saved again since is refused by a rank lacking it)."""
        changed = [(op, m) for op, m in new.modules.items() if old.modules.get(op) is not m]
        items = []
        for op, loaded in changed:
            try:
                src = read_source(loaded.path)
            except ModuleLoadError:
                src = None
            items.append((op, loaded.version, src if src is not None and src.version == loaded.version else None))
        self.comm.send(("kernels", items))
        self.comm.all_or_none(lambda: None)

    def swap_layout(self, cache: "LeaderCache", loaded: LoadedModule, streams: list[tuple[int, int]]) -> "LeaderCache":
        """A lab layout swap (EnginePort.layout_hook): every rank builds a cache of `loaded`'s layout
        for its own heads and moves each (stream, n)'s first n cells into it (no K/V crosses
        ranks); -> rank 0's new cache, which the other ranks mirror. On every rank or on none:
        ModuleLoadError leaves each rank serving `cache`."""
        inner = cache.inner
        self.use(inner)
        src = self._layout_bytes(loaded)   # raises before anything is sent: the file changed
        self.comm.send(("layout", loaded.version, src, streams))
        new = self.comm.all_or_none(lambda: inner.migrated(loaded, streams))
        self.layouts.add(loaded.version)
        self.current = new
        return LeaderCache(new, self)

    def _layout_bytes(self, loaded: LoadedModule) -> Source | None:
        """None for a version the other ranks hold; else the file's bytes, which must still have
        the version rank 0 loaded (ModuleLoadError otherwise: what was validated is gone)."""
        if loaded.version in self.layouts:
            return None
        src = read_source(loaded.path)
        if src.version != loaded.version:
            raise ModuleLoadError(f"{loaded.path}: saved again since version {loaded.version} was validated "
                                  f"(now {src.version}); under --tp its bytes go to every rank: swap again")
        return src

    def heads(self, rank: int) -> slice:
        h0, h1 = self.plan.kv_heads[rank]
        return slice(h0, h1)


class LeaderCache:
    """The engine's KVCache on rank 0 under --tp: edits sent to every rank, reads local."""

    def __init__(self, inner: KVCache, leader: Leader) -> None:
        self.inner, self._leader = inner, leader
        leader.use(inner)

    def __getattr__(self, name: str):   # local reads: write, view, budget, name, kv_type, bytes_used, ...
        return getattr(self.inner, name)

    @property
    def spec(self):
        """The whole model's KV geometry (every rank's heads): what export_stream gives and
        import_stream takes, and what slot files and the prompt cache hold."""
        return replace(self.inner.spec, n_kv_heads=sum(self._leader.plan.kv_counts()))

    def _send(self, method: str, *args) -> None:
        self._leader.use(self.inner)
        self._leader.comm.send(("op", method, args))

    @property
    def layout(self) -> "_LayoutProxy":
        return _LayoutProxy(self)

    def apply(self, moves, trims=()) -> None:
        self._send("apply", moves, trims)
        self.inner.apply(moves, trims)

    def trim(self, stream: int, n: int) -> None:
        self._send("trim", stream, n)
        self.inner.trim(stream, n)

    def shift(self, model, shift) -> None:
        self._send("shift", shift)
        self.inner.shift(model, shift)

    def release(self) -> None:
        self._send("release")
        self.inner.release()

    def restore(self) -> None:
        self._send("restore")
        self.inner.restore()

    def export_stream(self, stream: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Every rank's heads of the stream's first n cells: [n_layers, n, all kv_heads, head_dim]."""
        self._leader.use(self.inner)
        self._leader.comm.send(("export", stream, n))
        parts = self._leader.comm.gather(self.inner.export_stream(stream, n))
        return torch.cat([k for k, _ in parts], dim=2), torch.cat([v for _, v in parts], dim=2)

    def import_stream(self, stream: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """k, v: [n_layers, n, all kv_heads, head_dim]; each rank keeps its own heads."""
        self._leader.use(self.inner)
        self._leader.comm.send(("import", stream, k, v))
        mine = self._leader.heads(0)
        self.inner.import_stream(stream, k[:, :, mine].contiguous(), v[:, :, mine].contiguous())


class _LayoutProxy:
    """`cache.layout` of a LeaderCache: `copy_stream` (forks, the prompt cache's slot copies) sent
    to every rank; anything else read from rank 0's layout."""

    def __init__(self, cache: LeaderCache) -> None:
        self._cache = cache

    def __getattr__(self, name: str):
        return getattr(self._cache.inner.layout, name)

    def copy_stream(self, src: int, dst: int, n: int) -> None:
        self._cache._send("copy_stream", src, dst, n)
        self._cache.inner.layout.copy_stream(src, dst, n)


def worker_spec(spec, n_kv_heads: int):
    """The KVSpec rank 0 sent, with this rank's head count."""
    return replace(spec, n_kv_heads=n_kv_heads)
