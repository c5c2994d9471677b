"""Ranks 1..N-1 of `--tp N`: apply what rank 0 sends (leader.py lists the messages), run the forward.

A worker holds its shard of the weights and a KV cache of its own heads, and nothing else: no
scheduler, no sampler, no HTTP, no lab and no file watcher (rank 0's lab validates; its swaps
arrive as bytes). It keeps every kernel and layout module it served (a rollback names a version
only). It leaves the loop on ("stop",) or when rank 0's connection goes (the collective raises),
and a spawned worker also when its parent process is gone. A swap refused on any rank
(`Comm.all_or_none`) is logged and the loop goes on with what served before.
"""

from __future__ import annotations

import logging

from slotserver.engine.kv_cache import KVCache
from slotserver.parallel.comm import Comm
from slotserver.parallel.leader import worker_spec
from slotserver.parallel.shard import ShardPlan
from slotserver.errors import ModuleLoadError
from slotserver.runtime.kernel_set import load_kernel
from slotserver.runtime.layouts import LAYOUT_CONTRACT
from slotserver.runtime.loader import LoadedModule, Source, load_source

log = logging.getLogger("slotserver.parallel")


def run_worker(model, comm: Comm, plan: ShardPlan, memory) -> None:
    """The loop, until rank 0 says stop. memory(cache): this rank's report (session.py)."""
    cache: KVCache | None = None
    served = {(op, m.version): m for op, m in model.kernels.modules.items()}   # every kernel this rank ran
    layouts: dict[str, LoadedModule] = {}   # version -> every layout rank 0 sent
    while True:
        msg = comm.send()
        kind = msg[0]
        if kind == "stop":
            return
        if kind == "cache":
            _, version, src, spec = msg
            cache = KVCache(_layout(layouts, version, src), worker_spec(spec, model.spec.n_kv_heads))
            log.info("rank %d: KV cache %s, %.1f MiB (%d KV heads)", comm.rank, cache.name,
                     cache.bytes_used() / 2**20, model.spec.n_kv_heads)
        elif kind == "forward":
            try:
                model.forward(msg[1], cache)
            except Exception:  # noqa: BLE001 - rank 0 fails the same step (same kernels, same shapes) and goes on
                log.exception("rank %d: forward failed", comm.rank)
        elif kind == "kernels":
            _refusable(comm, lambda: _swap_kernels(model, served, comm, msg[1]))
        elif kind == "layout":
            cache = _refusable(comm, lambda: _swap_layout(cache, layouts, comm, *msg[1:])) or cache
        elif kind == "report":
            comm.gather(memory(cache))
        else:
            _edit(cache, model, comm, plan, msg)


def _edit(cache: KVCache, model, comm: Comm, plan: ShardPlan, msg: tuple) -> None:
    """A KV-cache edit rank 0 made between two forwards, made on this rank's heads."""
    kind = msg[0]
    if kind == "export":
        comm.gather(cache.export_stream(msg[1], msg[2]))
    elif kind == "import":
        h0, h1 = plan.kv_heads[comm.rank]
        _, stream, k, v = msg
        cache.import_stream(stream, k[:, :, h0:h1].contiguous(), v[:, :, h0:h1].contiguous())
    elif kind == "op":
        method, args = msg[1], msg[2]
        if method == "copy_stream":
            cache.layout.copy_stream(*args)
        elif method == "shift":
            cache.shift(model, *args)
        else:
            getattr(cache, method)(*args)
    else:
        raise ValueError(f"rank {comm.rank}: unknown message {kind!r} from rank 0")


def _refusable(comm: Comm, swap):
    """-> swap(); None when it was refused on every rank (Comm.all_or_none): the old one serves."""
    try:
        return swap()
    except ModuleLoadError as e:
        log.warning("rank %d: lab swap refused: %s", comm.rank, e)
        return None


def _swap_kernels(model, served: dict, comm: Comm, items: list) -> None:
    """Rank 0's lab swapped each (op, version, Source or None): serve them from the next forward on,
    once every rank has them (`all_or_none`)."""
    loaded = comm.all_or_none(lambda: [(op, _kernel(served, op, version, src)) for op, version, src in items])
    for op, m in loaded:
        model.kernels = model.kernels.with_module(op, m)


def _kernel(served: dict, op: str, version: str, src: Source | None) -> LoadedModule:
    loaded = served.get((op, version))
    if loaded is None:
        if src is None:
            raise ModuleLoadError(f"kernel {op} {version} is not here and its file changed since it was validated")
        loaded = served[(op, version)] = load_kernel(src)
    return loaded


def _swap_layout(cache: KVCache, layouts: dict, comm: Comm, version: str, src: Source | None,
                 streams: list[tuple[int, int]]) -> KVCache:
    """Rank 0's lab swapped the layout: a cache of it for this rank's heads, each (stream, n)'s first
    n cells moved from `cache` (export/import on this rank's heads); -> it, once every rank made its own."""
    return comm.all_or_none(lambda: cache.migrated(_layout(layouts, version, src), streams))


def _layout(layouts: dict, version: str, src: Source | None) -> LoadedModule:
    """The layout module of `version`: one this rank holds, or `src`'s bytes (what rank 0 validated)."""
    loaded = layouts.get(version)
    if loaded is None:
        if src is None:
            raise ModuleLoadError(f"layout {version} is not here and rank 0 sent no bytes")
        loaded = layouts[version] = load_source(src, LAYOUT_CONTRACT)
    return loaded
