"""The engine's KV cache: a layout object plus the bookkeeping of defrag moves.

`apply(moves, trims)` carries out a step plan's KV edits: trims first (a paged layout drops the
blocks past a stream's kept cells; flat layouts have nothing to free), then the defrag moves with
the layout's `copy_stream` (a slice copy for flat layouts, a block-table edit for paged ones),
counting moves and bytes moved. `budget()` tells the scheduler a paged pool's capacity.

Whether the layout is paged is decided once, by its view (`is_paged`); `create_layout` has then
checked the paged contract (`PagedLayout`, slotserver/runtime/paged_contract.py), so the paged calls
here (`trim_stream`, `free_stream`, `block_size`, `max_blocks`) are made without probing.

`kv_type` names what a cell holds: the spec's float type (`f32`, `f16`, `bf16`), or what a layout
module declares in `KV_TYPE` when it stores something else (q8: int8 with a scale per row). Two
layouts of the same kv_type give the same floats (the attention kernels share their C, see
kernels/attention.c), so a swap between them changes no answer; a swap into another kv_type may,
and /lab and `top` say which one serves.

A hybrid model's recurrent states (runtime/recurrent_state.py) live here too, as `recurrent`
(made by the engine at start; after a sleep, by the model's first forward): every KV edit below
tells them, so that a stream whose KV they no longer match is marked and never continued from the
wrong state. A trim to n cells puts a state back to n tokens where it can (`RecurrentState.trim`).
"""

from __future__ import annotations

import torch

from slotserver.runtime.kv_spec import KVSpec
from slotserver.runtime.layouts import create_layout, load_layout
from slotserver.runtime.loader import LoadedModule
from slotserver.runtime.paged_contract import KVBudget, is_paged
from slotserver.engine.stream_map import Move


FLOAT_KV_TYPES = {torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16"}


class KVCache:
    def __init__(self, loaded: LoadedModule, spec: KVSpec) -> None:
        self.loaded, self.spec = loaded, spec
        self.layout = create_layout(loaded, spec)
        self.paged = is_paged(self.layout)
        self.n_moves = 0
        self.bytes_moved = 0
        self.recurrent = None   # a hybrid model's RecurrentState
        self.max_checkpoints = 0   # its checkpoints a stream (--ctx-checkpoints; set by the engine)

    @classmethod
    def create(cls, name: str, spec: KVSpec, folder=None) -> "KVCache":
        return cls(load_layout(name, folder), spec)

    @property
    def name(self) -> str:
        return self.loaded.module.NAME

    @property
    def kv_type(self) -> str:
        declared = getattr(self.loaded.module, "KV_TYPE", None)
        return str(declared) if declared else FLOAT_KV_TYPES.get(self.spec.dtype, str(self.spec.dtype))

    def budget(self) -> KVBudget | None:
        """A paged pool's capacity, which the scheduler asks in cells; None for flat layouts."""
        return KVBudget.of(self.layout) if self.paged else None

    def apply(self, moves: list[Move], trims: tuple[tuple[int, int], ...] = ()) -> None:
        for stream, n in trims:  # paged: blocks past the kept cells go back
            self.trim(stream, n)
        for m in moves:
            self.layout.copy_stream(m.src, m.dst, m.n_cells)
            if self.recurrent is not None:
                self.recurrent.copy_stream(m.src, m.dst, m.n_cells)
            if self.paged:
                self.layout.free_stream(m.src)  # a defrag move abandons its source: its blocks go back
            self.n_moves += 1
            self.bytes_moved += m.n_cells * self.spec.bytes_per_cell

    def shift(self, model, shift) -> None:
        """A context shift or cache-reuse move (engine/kv_shift.py): cells moved down, K re-rotated.
        A method so that --tp's rank 0 (slotserver/parallel/leader.py) can send it to every rank."""
        from slotserver.engine.kv_shift import apply_shift
        apply_shift(self, model, shift)

    # the model talks to the layout through these two
    def write(self, layer, streams, positions, k, v) -> None:
        self.layout.write(layer, streams, positions, k, v)

    def view(self, layer):
        return self.layout.view(layer)

    def export_stream(self, stream: int, n: int):
        return self.layout.export_stream(stream, n)

    def import_stream(self, stream: int, k, v) -> None:
        """Write canonical K/V into the stream's first cells; a paged stream then holds only those."""
        self.layout.import_stream(stream, k, v)
        if self.paged:
            self.layout.trim_stream(stream, k.shape[1])
        if self.recurrent is not None:   # K/V from elsewhere: no state of this stream matches them
            self.recurrent.invalidate(stream)

    def trim(self, stream: int, n: int) -> None:
        """Keep the stream's first `n` cells' memory (paged: later blocks go back; flat: no-op)."""
        if self.paged:
            self.layout.trim_stream(stream, n)
        if self.recurrent is not None:
            self.recurrent.trim(stream, n)

    def migrated(self, loaded: LoadedModule, streams: list[tuple[int, int]]) -> "KVCache":
        """A new cache of `loaded`'s layout and this spec, holding each (stream, n)'s first n cells
        (canonical export/import: any layout to any other), and this one's move counts. A lab
        layout swap (engine/port.py); under --tp every rank makes it on its own heads."""
        new = KVCache(loaded, self.spec)
        new.n_moves, new.bytes_moved = self.n_moves, self.bytes_moved
        for stream, n in streams:
            new.import_stream(stream, *self.export_stream(stream, n))
        new.recurrent = self.recurrent   # the states do not depend on the KV layout: they stay as they are
        new.max_checkpoints = self.max_checkpoints
        return new

    def bytes_used(self) -> int:
        kv = self.layout.bytes_used() if self.layout is not None else 0
        return kv + (self.recurrent.bytes_used() if self.recurrent is not None else 0)

    # --sleep-idle-seconds (engine/sleep.py): the memory goes, the layout module and spec stay
    def release(self) -> None:
        """Free the KV memory; nothing may read or write the cache until `restore()`."""
        self.layout = self.recurrent = None

    def restore(self) -> None:
        """Fresh, zeroed KV memory of the same layout module and spec (no cell holds valid KV)."""
        self.layout = create_layout(self.loaded, self.spec)
