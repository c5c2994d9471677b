"""`TopState`: everything one frame shows, updated from one `Poll` at a time.

A poll without a usable `/lab` answer keeps the last good rows (drawn dimmed, with the error) and
marks the state disconnected; the next good poll replaces everything. Shape problems inside a good
answer do not disconnect: the sections that parse are shown, the others are listed in `problems`.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass, field

from slotserver.top.client import Poll
from slotserver.top.parse import (as_dict, parse_events, parse_header, parse_kernels, parse_layouts, parse_slots,
                                  section)
from slotserver.top.rows import Defrag, EventRow, Header, KernelRow, SlotRow, StreamCell
from slotserver.top.track import Tracker, stream_map, update_defrag

HISTORY = 256   # samples kept per sparkline; a wide terminal shows at most this many


def _ring() -> collections.deque:
    return collections.deque(maxlen=HISTORY)


@dataclass
class TopState:
    url: str = ""
    connected: bool = False
    error: str | None = None             # why the last poll failed (None when connected)
    down_since: float | None = None      # monotonic time of the first failed poll in a row
    now: float = 0.0                     # monotonic time of the last poll
    polls_ok: int = 0
    header: Header = field(default_factory=Header)
    slots: list[SlotRow] = field(default_factory=list)
    streams: list[StreamCell] = field(default_factory=list)
    defrag: Defrag = field(default_factory=Defrag)
    kernels: list[KernelRow] = field(default_factory=list)
    events: list[EventRow] = field(default_factory=list)
    layouts: list[str] = field(default_factory=list)
    reloads: dict[str, int] = field(default_factory=dict)
    tps_history: collections.deque = field(default_factory=_ring)
    step_history: collections.deque = field(default_factory=_ring)
    problems: list[str] = field(default_factory=list)
    message: str = ""                    # the last key action's outcome
    tracker: Tracker = field(default_factory=Tracker, repr=False, compare=False)

    @property
    def has_data(self) -> bool:
        return self.polls_ok > 0

    def apply(self, poll: Poll) -> "TopState":
        self.now = poll.at
        lab = poll.lab
        if lab is not None and not isinstance(lab, dict):
            return self._lost(poll, f"/lab: expected a JSON object, got {type(lab).__name__}")
        if lab is None:
            return self._lost(poll, poll.error or "no answer")
        self.connected, self.error, self.down_since = True, None, None
        self.polls_ok += 1
        self._read(lab, as_dict(poll.props), poll)
        return self

    def next_layout(self) -> str | None:
        """The layout after the serving one, in the server's list order (wrapping around)."""
        if not self.layouts:
            return None
        if self.header.layout not in self.layouts:
            return self.layouts[0]
        return self.layouts[(self.layouts.index(self.header.layout) + 1) % len(self.layouts)]

    def _lost(self, poll: Poll, error: str) -> "TopState":
        self.connected, self.error = False, error
        self.header.health = poll.health
        if self.down_since is None:
            self.down_since = poll.at
        self.tracker.reset()
        return self

    def _read(self, lab: dict, props: dict, poll: Poll) -> None:
        problems: list[str] = []
        engine = section(lab, "engine", dict, problems)
        header = parse_header(lab, engine, props, problems)
        header.health = poll.health
        slots = parse_slots(section(engine, "slots", list, problems), problems)
        events = parse_events(section(lab, "events", list, problems), problems)
        self.kernels = parse_kernels(section(lab, "kernels", list, problems), events, problems)
        self.events, self.slots, self.layouts = events, slots, parse_layouts(lab)
        self.reloads = {k: v for k, v in as_dict(as_dict(lab.get("stats")).get("reloads")).items()
                        if isinstance(v, int)}
        self._derive(header, engine, poll.at)
        self.problems = problems

    def _derive(self, header: Header, engine: dict, now: float) -> None:
        t = self.tracker
        t.elapsed(self.slots, now)
        tps, step_ms = t.rates(engine, now)
        header.tokens_per_second = tps
        header.uptime_s, header.uptime_exact = t.uptime(header.uptime_s, now)
        if tps is not None:
            self.tps_history.append(tps)
            self.step_history.append(step_ms or 0.0)
        self.defrag = update_defrag(self.defrag, engine, t.moves(self.slots), now)
        self.streams = stream_map(self.slots, header.defrag)
        self.header = header
