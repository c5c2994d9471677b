"""`EnginePort`: the verbs the lab and the slot files use; the engine's state stays the engine's.

Why a port: the lab swaps kernels and layouts and the slot files copy a slot's KV in and out, and
both used to assign `engine.cache` or walk `engine.sched.slots` themselves. Every such change now
goes through one of these verbs, which keep the engine's invariants (a layout swap migrates every
slot's valid cells; a slot is touched only while idle). All mutating verbs run on the engine
thread: the lab's swaps from `Lab.apply_pending` (between two steps), the slot files through
`Engine.call`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from slotserver.errors import RequestError
from slotserver.runtime.device import describe
from slotserver.runtime.kernel_set import KernelSet
from slotserver.runtime.loader import LoadedModule


class SlotBusy(RuntimeError):
    """The slot is processing a request (HTTP 409)."""


@dataclass(frozen=True)
class KVGeometry:
    """What a slot's canonical K/V must look like for the running model and cache."""
    n_layers: int
    n_kv_heads: int
    head_dim: int
    dtype: torch.dtype
    n_cells: int         # a slot's context
    vocab_size: int


class EnginePort:
    def __init__(self, engine) -> None:
        self._e = engine
        self.kernel_hook = None   # (old, new) KernelSet before a swap (--tp: sent to every rank)
        self.layout_hook = None   # (cache, loaded, streams) -> the new cache (--tp: made on every rank)

    # -- what serves ---------------------------------------------------------------------------
    @property
    def kernels(self) -> KernelSet:
        return self._e.bundle.model.kernels

    @property
    def device(self) -> str:
        """"cpu" or "cuda": where kernels are validated and serve."""
        return self._e.device

    def device_name(self) -> str:
        return describe(self._e.device)

    @property
    def layout(self) -> LoadedModule:
        return self._e.cache.loaded

    def layout_info(self) -> dict:
        c = self._e.cache
        return {"name": c.name, "version": c.loaded.version, "bytes": c.bytes_used(), "kv_type": c.kv_type}

    def stats(self):
        return self._e.stats()

    def wake(self) -> None:
        self._e.wake()

    # -- swaps (engine thread, between two steps) -----------------------------------------------
    def swap_kernels(self, new: KernelSet) -> KernelSet:
        """Serve `new` from the next forward on; -> the set it replaces (for a rollback)."""
        model = self._e.bundle.model
        if self.kernel_hook is not None:
            self.kernel_hook(model.kernels, new)
        old, model.kernels = model.kernels, new
        return old

    def swap_layout(self, loaded: LoadedModule) -> int:
        """A new layout object; every slot's valid KV moved over canonically. -> cells migrated.
        With `layout_hook` (--tp, slotserver/parallel/leader.py) the hook makes the new cache, on
        every rank; a hook that raises leaves the old cache serving (the lab reports the refusal)."""
        e = self._e
        streams = [(e.sched.streams.stream_of[s.id], s.n_valid) for s in e.sched.slots.slots if s.n_valid]
        if self.layout_hook is not None:
            e.cache = self.layout_hook(e.cache, loaded, streams)
        else:
            e.cache = e.cache.migrated(loaded, streams)
        return sum(n for _, n in streams)

    # -- one idle slot's KV (engine thread) ------------------------------------------------------
    def geometry(self) -> KVGeometry:
        s, e = self._e.bundle.model.spec, self._e
        # the cache's heads: under --tp, every rank's (slotserver/parallel/leader.py), as slot files hold
        return KVGeometry(s.n_layers, e.cache.spec.n_kv_heads, s.head_dim, e.cache.spec.dtype, e.config.n_cells,
                          s.vocab_size)

    def export_slot(self, slot_id: int) -> tuple[list[int], torch.Tensor, torch.Tensor]:
        """(cached tokens, K, V) of an idle slot, K/V canonical `[n_layers, n, kv_heads, head_dim]`.
        Its `ns` (the adapters the KV was computed under): `slot_ns`."""
        slot = self.require_idle(slot_id)
        tokens = list(slot.cached)
        k, v = self._e.cache.export_stream(self._stream(slot_id), len(tokens))
        dtype = self._e.cache.spec.dtype
        return tokens, k.to(dtype), v.to(dtype)

    def slot_ns(self, slot_id: int) -> str:
        """The LoRA adapters an idle slot's KV was computed under (engine/lora_scales.py; "": none)."""
        return self.require_idle(slot_id).ns

    def import_slot(self, slot_id: int, tokens: list[int], k: torch.Tensor, v: torch.Tensor, ns: str = "") -> None:
        """An idle slot's prompt cache becomes `tokens` with this K/V (checked by the caller),
        computed under adapters `ns`."""
        slot = self.require_idle(slot_id)
        self._e.cache.import_stream(self._stream(slot_id), k, v)
        slot.cached, slot.ns = list(tokens), ns

    def erase_slot(self, slot_id: int) -> int:
        """Drop an idle slot's prompt cache (a paged layout gets its blocks back). -> cells erased."""
        slot = self.require_idle(slot_id)
        n, slot.cached = len(slot.cached), []
        self._e.cache.trim(self._stream(slot_id), 0)
        return n

    def require_idle(self, slot_id: int):
        """The idle slot; RequestError for an id out of range, SlotBusy for a slot that is processing."""
        n = self._e.config.n_parallel
        if type(slot_id) is not int or not 0 <= slot_id < n:
            raise RequestError(f"id_slot must be in [0, {n})")
        slot = self._e.sched.slots.slots[slot_id]
        if not slot.idle:
            raise SlotBusy(f"slot {slot_id} is processing a request")
        return slot

    def _stream(self, slot_id: int) -> int:
        return self._e.sched.streams.stream_of[slot_id]
