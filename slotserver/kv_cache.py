"""The engine's KV cache: a layout object plus the bookkeeping of defrag moves.

`apply(moves)` carries out a defrag plan with the layout's `copy_stream` (a slice copy for flat
layouts, a block-table edit for paged ones) and counts moves and bytes moved.
"""

from __future__ import annotations

from slotserver.kv_spec import KVSpec
from slotserver.layout_loader import create_layout, load_layout
from slotserver.module_loader import LoadedModule
from slotserver.stream_map import Move


class KVCache:
    def __init__(self, loaded: LoadedModule, spec: KVSpec) -> None:
        self.loaded, self.spec = loaded, spec
        self.layout = create_layout(loaded, spec)
        self.n_moves = 0
        self.bytes_moved = 0

    @classmethod
    def create(cls, name: str, spec: KVSpec, folder=None) -> "KVCache":
        return cls(load_layout(name, folder), spec)

    @property
    def name(self) -> str:
        return self.loaded.module.NAME

    def apply(self, moves: list[Move]) -> None:
        free = getattr(self.layout, "free_stream", None)  # paged: the source's blocks go back
        for m in moves:
            self.layout.copy_stream(m.src, m.dst, m.n_cells)
            if free is not None:
                free(m.src)  # a defrag move abandons its source stream
            self.n_moves += 1
            self.bytes_moved += m.n_cells * self.spec.bytes_per_cell

    # the model talks to the layout through these two
    def write(self, layer, streams, positions, k, v) -> None:
        self.layout.write(layer, streams, positions, k, v)

    def view(self, layer):
        return self.layout.view(layer)

    def export_stream(self, stream: int, n: int):
        return self.layout.export_stream(stream, n)

    def import_stream(self, stream: int, k, v) -> None:
        self.layout.import_stream(stream, k, v)

    def bytes_used(self) -> int:
        return self.layout.bytes_used()
