"""Slot -> KV stream map and sequence defragmentation.

Every slot owns one stream (its KV, including an idle slot's prompt cache). With defrag on there
is one spare stream more than slots. `plan_defrag` rearranges the map so the active slots sit on
streams 0..n_active-1 and returns the copies (`Move`) that the KV cache must carry out, in order,
to make the memory agree with the new map: llama.cpp's `seq_cp`. An idle slot in the way is first
moved to the spare stream, so no prompt cache is ever lost to a defrag.
"""

from __future__ import annotations

from dataclasses import dataclass

from slotserver.engine.slots import Slot


@dataclass(frozen=True)
class Move:
    src: int       # stream to copy from
    dst: int       # stream to copy to
    n_cells: int   # the first n cells (all that is valid)


class StreamMap:
    def __init__(self, n_slots: int, n_streams: int) -> None:
        assert n_streams >= n_slots
        self.stream_of = {slot: slot for slot in range(n_slots)}  # slot id -> stream
        self.n_streams = n_streams
        self._check()

    def free_streams(self) -> list[int]:
        used = set(self.stream_of.values())
        return [s for s in range(self.n_streams) if s not in used]

    def slot_on(self, stream: int) -> int | None:
        for slot, s in self.stream_of.items():
            if s == stream:
                return slot
        return None

    def plan_defrag(self, slots: list[Slot]) -> list[Move]:
        """Remap so active slots occupy 0..k-1; -> the moves that realise the new map."""
        active = [s for s in slots if not s.idle]
        k = len(active)
        misplaced = sorted((s for s in active if self.stream_of[s.id] >= k), key=lambda s: self.stream_of[s.id])
        if not misplaced:
            return []
        by_id = {s.id: s for s in slots}
        holes = [st for st in range(k) if (o := self.slot_on(st)) is None or by_id[o].idle]
        moves: list[Move] = []
        for slot, hole in zip(misplaced, holes):
            owner = self.slot_on(hole)
            if owner is not None:  # an idle slot's cache: park it on the spare stream first
                spare = self.free_streams()[0]
                if by_id[owner].n_valid:
                    moves.append(Move(hole, spare, by_id[owner].n_valid))
                self.stream_of[owner] = spare
            src = self.stream_of[slot.id]
            if slot.n_valid:
                moves.append(Move(src, hole, slot.n_valid))
            self.stream_of[slot.id] = hole
        self._check()
        return moves

    def is_packed(self, slots: list[Slot]) -> bool:
        """Active slots occupy exactly streams 0..n_active-1."""
        active = {self.stream_of[s.id] for s in slots if not s.idle}
        return active == set(range(len(active)))

    def _check(self) -> None:
        streams = list(self.stream_of.values())
        assert len(set(streams)) == len(streams), "two slots on one stream"
        assert all(0 <= s < self.n_streams for s in streams), "stream out of range"
