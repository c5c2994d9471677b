"""One process's part in `--tp N`: its rank, the shard plan, and (rank 0) the leader.

The command line calls four things: `prepare(model)` after loading (shard, and on rank 0 hook the
model), then on rank 0 `attach(engine)` or `cache(...)` for `generate`, `report()` for the per-rank
memory, and `stop()` when done; on the other ranks `serve()` (the worker loop) instead.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from slotserver.engine.kv_cache import KVCache
from slotserver.errors import ConfigError
from slotserver.parallel.comm import Comm
from slotserver.parallel.launch import Ranks, start
from slotserver.parallel.leader import Leader, LeaderCache
from slotserver.parallel.shard import ShardPlan, shard_model
from slotserver.parallel.worker import run_worker
from slotserver.runtime.layouts import load_layout

log = logging.getLogger("slotserver.parallel")


@dataclass
class TPSession:
    comm: Comm
    ranks: Ranks
    plan: ShardPlan | None = None
    leader: Leader | None = None
    memory: list[dict] = field(default_factory=list)   # per rank, after `report()` (rank 0)

    @classmethod
    def start(cls, tp: int, argv: list[str]) -> "TPSession | None":
        got = start(tp, argv)
        return None if got is None else cls(*got)

    @property
    def leads(self) -> bool:
        return self.comm.leads

    def threads(self, cores: int) -> int:
        """-t 0 under --tp: this machine's cores shared by its ranks."""
        return max(1, cores // self.ranks.local_world)

    def prepare(self, model) -> None:
        """This rank's slice of the loaded model; rank 0's forwards then go to every rank."""
        self.plan = ShardPlan.make(model, self.comm.world)
        shard_model(model, self.comm, self.plan)
        if self.leads:
            self.leader = Leader(self.comm, self.plan)
            self.leader.attach(model)

    def serve(self, model) -> None:
        """Ranks 1..N-1: the worker loop, then what rank 0 asks at the end (the memory report)."""
        run_worker(model, self.comm, self.plan, lambda cache: _memory(self.comm.rank, model, cache))

    def attach(self, engine) -> None:
        """The engine's KV cache edits go to every rank (leader.py); then the per-rank memory."""
        engine.cache = LeaderCache(engine.cache, self.leader)
        engine.port.kernel_hook = self.leader.swap_kernels
        engine.port.layout_hook = self.leader.swap_layout   # lab swaps: on every rank (leader.py)
        ranks = [{k: v for k, v in r.items() if k not in ("kernels", "layout")}
                 for r in self.report(engine.bundle.model, engine.cache.inner)]
        engine.tp_memory = {"world": self.comm.world, "ranks": ranks}   # /props (at start)

    def cache(self, spec, layout: str, layouts_dir=None) -> KVCache:
        """`generate`'s KV cache (make_cache), mirrored on every rank."""
        cache = KVCache(load_layout(layout, layouts_dir), spec)
        self.leader.use(cache)
        return cache

    def report(self, model, cache: KVCache | None) -> list[dict]:
        """Every rank's weights, KV bytes, kernel versions and layout (on rank 0; None elsewhere):
        the memory logged and kept for /props, the modules to check that a lab swap reached every rank."""
        self.comm.send(("report",))
        self.memory = self.comm.gather(_memory(0, model, cache))
        for m in self.memory:
            log.info("tp rank %d/%d: weights %.1f MiB, KV cache %.1f MiB (%d KV heads)", m["rank"], self.comm.world,
                     m["weights_bytes"] / 2**20, m["kv_bytes"] / 2**20, m["kv_heads"])
        return self.memory

    def check(self, plan, embedding: bool = False) -> None:
        """What --tp does not run, refused in one line (a LaunchPlan: server/launch.py)."""
        problems = {"--device cuda (--tp runs over gloo on the CPU)": plan.model.device == "cuda",
                    "--sleep-idle-seconds (a wake reloads the whole weights)": plan.engine.sleep_idle_s > 0,
                    "--embedding / --reranking": embedding,
                    "--lora (the adapters' deltas are not sharded)": bool(plan.model.lora)}
        for what, bad in problems.items():
            if bad:
                raise ConfigError(f"--tp {self.comm.world} does not run with {what}")

    def serve_worker(self, plan) -> int:
        """`serve --tp N` on ranks 1..N-1: load, shard, warm up, then the worker loop."""
        from slotserver.model.bundle import ModelBundle

        bundle = ModelBundle.load(plan.model, None, check_tensors=plan.check_tensors)
        self.prepare(bundle.model)
        if plan.warmup:
            bundle.model.warm_up()
        self.serve(bundle.model)
        return 0

    def stop(self) -> None:
        if self.leader is not None:
            self.leader.stop()


def _memory(rank: int, model, cache: KVCache | None) -> dict:
    w = model.weights
    embed = w.embed.dense if w.embed.dense is not None else w.embed.blocks.raw   # replicated
    experts = sum(lw.moe.nbytes() for lw in w.layers if lw.moe is not None)   # this rank's slice, the router
    weights = sum(m.nbytes() for m in w.matmuls()) + experts + embed.numel() * embed.element_size()
    return {"rank": rank, "weights_bytes": weights, "kv_bytes": cache.bytes_used() if cache is not None else 0,
            "kv_heads": model.spec.n_kv_heads,
            "kernels": {op: m.version for op, m in sorted(model.kernels.modules.items())},
            "layout": None if cache is None else {"name": cache.name, "version": cache.loaded.version}}
