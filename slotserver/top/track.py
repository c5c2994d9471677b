"""What needs two polls: tokens/s now, mean step time, defrag moves, elapsed times, uptime.

Why derive instead of showing the engine's own numbers: the engine republishes its stats only
after a step that did work, so once it goes idle its `tokens_per_second`, `last_step_ms` and
`uptime_s` stay frozen at their last values. Counter deltas between polls are always current: an
idle server reads 0 tokens/s here, not the rate of the last request.
"""

from __future__ import annotations

from dataclasses import dataclass

from slotserver.top.parse import as_dict, as_float, as_int
from slotserver.top.rows import Defrag, SlotMove, SlotRow, StreamCell

PHASES = ("schedule", "moves", "forward", "sample", "postprocess")


@dataclass(frozen=True)
class Counters:
    at: float                 # monotonic seconds of the poll
    predicted: int | None     # engine.predicted_tokens
    steps: int | None         # engine.steps
    step_total_ms: float | None   # sum over steps of all phases (mean per step x steps)


def counters(engine: dict, now: float) -> Counters:
    steps = as_int(engine.get("steps"))
    timings = as_dict(engine.get("timings"))
    means = [as_float(timings.get(p)) for p in PHASES]
    total = None if steps is None or None in means else sum(means) * steps
    return Counters(now, as_int(engine.get("predicted_tokens")), steps, total)


class Tracker:
    def __init__(self) -> None:
        self.prev: Counters | None = None
        self.prev_streams: dict[int, int] = {}
        self.first_seen: dict[tuple[int, int | None], float] = {}
        self.uptime_anchor: tuple[float, float] | None = None
        self.uptime_exact = False

    def reset(self) -> None:
        """Forget the previous poll (after a disconnect: deltas across it would mislead)."""
        self.prev = None

    def rates(self, engine: dict, now: float) -> tuple[float | None, float | None]:
        """(tokens per second, mean ms per step) over the time since the previous poll."""
        cur, prev = counters(engine, now), self.prev
        self.prev = cur
        if prev is None or None in (cur.predicted, prev.predicted) or cur.at <= prev.at:
            return None, None
        d_tokens = cur.predicted - prev.predicted
        if d_tokens < 0:                      # the server restarted: counters went back
            return None, None
        tps = d_tokens / (cur.at - prev.at)
        step_ms = 0.0
        if None not in (cur.steps, prev.steps, cur.step_total_ms, prev.step_total_ms) and cur.steps > prev.steps:
            step_ms = max(0.0, (cur.step_total_ms - prev.step_total_ms) / (cur.steps - prev.steps))
        return tps, step_ms

    def moves(self, slots: list[SlotRow]) -> list[SlotMove]:
        """Slots whose stream changed since the previous poll, sorted by destination stream."""
        now = {s.id: s.stream for s in slots if s.stream is not None}
        out = [SlotMove(sid, self.prev_streams[sid], st) for sid, st in now.items()
               if sid in self.prev_streams and self.prev_streams[sid] != st]
        self.prev_streams = now
        return sorted(out, key=lambda m: m.dst)

    def elapsed(self, slots: list[SlotRow], now: float) -> None:
        """Fill `elapsed_s` of busy slots with the best lower bound known of their task's age.

        Two bounds: the time since this monitor first saw the task, and its decode time, which
        the slot's own rate gives back ((n_generated - 1) / tokens_per_second, as the engine
        computes that rate since the prompt was done). Prefill time is in neither."""
        seen = {}
        for s in slots:
            if s.active:
                key = (s.id, s.id_task)
                seen[key] = self.first_seen.get(key, now)
                decode = 0.0
                if s.tokens_per_second and s.n_generated and s.n_generated > 1:
                    decode = (s.n_generated - 1) / s.tokens_per_second
                s.elapsed_s = max(now - seen[key], decode)
        self.first_seen = seen

    def uptime(self, reported: float | None, now: float) -> tuple[float | None, bool]:
        """(the server's uptime carried forward while its snapshot is frozen, whether it is exact).

        The first value seen may already be stale (an engine idle since its last step), so it
        is only a lower bound until the value is seen to change, i.e. freshly published."""
        if reported is None:
            return None, False
        if self.uptime_anchor is None or self.uptime_anchor[0] != reported:
            self.uptime_exact = self.uptime_anchor is not None
            self.uptime_anchor = (reported, now)
        return reported + (now - self.uptime_anchor[1]), self.uptime_exact


def update_defrag(d: Defrag, engine: dict, moves: list[SlotMove], now: float) -> Defrag:
    """The engine's copy counters, and the latest remap seen (moves plus counter deltas)."""
    total, nbytes = as_int(engine.get("defrag_moves")), as_int(engine.get("defrag_bytes"))
    copies = (total - d.moves_total) if None not in (total, d.moves_total) else 0
    moved = (nbytes - d.bytes_total) if None not in (nbytes, d.bytes_total) else 0
    out = Defrag(total, nbytes, d.last_moves, d.last_copies, d.last_bytes, d.last_at)
    if moves or copies > 0:
        out.last_moves, out.last_copies, out.last_bytes, out.last_at = moves, max(copies, 0), max(moved, 0), now
    return out


def stream_map(slots: list[SlotRow], defrag: str) -> list[StreamCell]:
    """Streams 0..n-1 and who holds each; n = max stream + 1, at least slots + 1 with defrag on.

    An idle slot holding no cells is drawn as free: its stream holds nothing worth keeping.
    """
    held = {s.stream: s for s in slots if s.stream is not None and s.stream >= 0}
    n = max(held, default=-1) + 1
    if defrag == "on":
        n = max(n, len(slots) + 1)
    cells = []
    for st in range(min(n, 1024)):            # a garbage stream number must not draw forever
        s = held.get(st)
        used = (s.cells_used or 0) if s else 0
        kind = "free" if s is None or (not s.active and used == 0) else ("active" if s.active else "idle")
        cells.append(StreamCell(st, kind, s.id if s else None, used, s.n_ctx if s else None))
    return cells
