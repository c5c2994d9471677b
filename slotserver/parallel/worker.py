"""Ranks 1..N-1 of `--tp N`: apply what rank 0 sends (leader.py lists the messages), run the forward.

A worker holds its shard of the weights and a KV cache of its own heads, and nothing else: no
scheduler, no sampler, no HTTP. It leaves the loop on ("stop",) or when rank 0's connection goes
(the collective raises), and a spawned worker also when its parent process is gone.
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from slotserver.engine.kv_cache import KVCache
from slotserver.parallel.comm import Comm
from slotserver.parallel.leader import worker_spec
from slotserver.parallel.shard import ShardPlan
from slotserver.errors import ModuleLoadError
from slotserver.runtime.kernel_set import load_kernel
from slotserver.runtime.layouts import load_layout

log = logging.getLogger("slotserver.parallel")


def run_worker(model, comm: Comm, plan: ShardPlan, memory) -> None:
    """The loop, until rank 0 says stop. memory(cache): this rank's report (session.py)."""
    cache: KVCache | None = None
    served = {(op, m.version): m for op, m in model.kernels.modules.items()}   # every kernel this rank ran
    while True:
        msg = comm.send()
        kind = msg[0]
        if kind == "stop":
            return
        if kind == "cache":
            path, spec = Path(msg[1]), msg[2]
            cache = KVCache(load_layout(path.stem, path.parent), worker_spec(spec, model.spec.n_kv_heads))
            log.info("rank %d: KV cache %s, %.1f MiB (%d KV heads)", comm.rank, cache.name,
                     cache.bytes_used() / 2**20, model.spec.n_kv_heads)
        elif kind == "forward":
            try:
                model.forward(msg[1], cache)
            except Exception:  # noqa: BLE001 - rank 0 fails the same step (same kernels, same shapes) and goes on
                log.exception("rank %d: forward failed", comm.rank)
        elif kind == "kernel":
            _swap_kernel(model, served, *msg[1:])
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


def _swap_kernel(model, served: dict, op: str, version: str, src) -> None:
    """Rank 0's lab swapped `op` to `version`: serve it from the next forward on."""
    loaded = served.get((op, version))
    if loaded is None:
        if src is None:
            raise ModuleLoadError(f"rank {torch.distributed.get_rank()}: kernel {op} {version} is not here "
                                  "and its file changed since it was validated")
        loaded = served[(op, version)] = load_kernel(src)
    model.kernels = model.kernels.with_module(op, loaded)
