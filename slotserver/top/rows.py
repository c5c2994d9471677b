"""The rows the monitor shows: plain dataclasses, one per panel line, with "unknown" defaults.

Every field that a server answer may lack has a default that renders as "?" (None for numbers,
"?" for text), so a partial or oddly shaped answer still yields rows that can be drawn.
"""

from __future__ import annotations

from dataclasses import dataclass, field

UNKNOWN = "?"


@dataclass
class Header:
    model: str = UNKNOWN
    dtype: str = UNKNOWN
    device: str = UNKNOWN
    layout: str = UNKNOWN
    layout_version: str = UNKNOWN
    kv_type: str = ""                        # the layout's K/V element type ("f16", "bf16"); "": not reported
    uptime_s: float | None = None
    uptime_exact: bool = False               # False: a lower bound (see track.Tracker.uptime)
    tokens_per_second: float | None = None   # measured between polls (see track.py)
    queue_len: int | None = None
    n_active: int | None = None
    steps: int | None = None
    kv_bytes: int | None = None
    defrag: str = UNKNOWN
    cache_hit: float | None = None           # prompt tokens taken from a cache / all prompt tokens so far
    ram_cache_bytes: int | None = None       # --cache-ram's bytes (None: off, or a server without it)
    cpu: str = UNKNOWN                       # the kernels' CPU variant, e.g. "avx512", "avx2 (forced)"
    health: str = UNKNOWN                    # "ok" | "loading" | "error" | "?"


@dataclass
class SlotRow:
    id: int
    stream: int | None = None
    state: str = UNKNOWN                     # "idle" | "processing" | whatever the server says
    id_task: int | None = None
    n_prompt: int | None = None
    n_cached: int | None = None
    n_generated: int | None = None
    cells_used: int | None = None
    n_ctx: int | None = None
    tokens_per_second: float | None = None
    elapsed_s: float | None = None           # since the monitor first saw this task (track.py)

    @property
    def active(self) -> bool:
        return self.state == "processing"


@dataclass
class StreamCell:
    """One KV stream: who holds it. kind: "active" | "idle" (a slot's prompt cache) | "free"."""

    stream: int
    kind: str
    slot: int | None = None
    cells_used: int = 0
    n_ctx: int | None = None


@dataclass
class SlotMove:
    """A slot whose stream changed between two polls: what a defrag (or migration) did."""

    slot: int
    src: int
    dst: int


@dataclass
class Defrag:
    moves_total: int | None = None           # the engine's copy counter
    bytes_total: int | None = None
    last_moves: list[SlotMove] = field(default_factory=list)
    last_copies: int = 0                     # counter delta at the last observed remap
    last_bytes: int = 0
    last_at: float | None = None             # monotonic time of that poll


@dataclass
class KernelRow:
    op: str
    impl: str = UNKNOWN
    version: str = UNKNOWN
    mean_ms: float | None = None
    calls: int | None = None
    path: str | None = None                  # what the kernel computes with on the server's CPU
    check: str | None = None                 # the last lab event for this op: swapped | refused | ...
    check_reason: str | None = None


@dataclass
class EventRow:
    seq: int | None = None
    time: float | None = None                # wall-clock seconds (server's time.time())
    result: str = UNKNOWN                    # swapped | refused | accepted | rolled_back
    kind: str = UNKNOWN
    name: str = ""
    file: str = ""
    line: int | None = None                  # the source line a refusal points at; None: none
    reason: str | None = None
    latency_ms: float | None = None
    version: str | None = None

    @property
    def where(self) -> str:
        """`file.py:12`, the file's base name (full paths do not fit a terminal column)."""
        base = self.file.rsplit("/", 1)[-1] if self.file else ""
        return f"{base}:{self.line}" if base and self.line is not None else base
