"""One builder per panel: `TopState` -> (rich renderable, natural height in lines).

Each builder is told the width it gets and returns content that never wraps by surprise (cells
are `no_wrap` with ellipsis), so the height it reports is the height it draws; render.py uses
those heights to decide which panels fit. Table columns are dropped, least useful first, when the
panel is narrow.
"""

from __future__ import annotations

import time

from rich.console import Group
from rich.table import Table
from rich.text import Text

from slotserver.top import widgets as w
from slotserver.top.model import TopState
from slotserver.top.rows import KernelRow, SlotRow, StreamCell

STATE_STYLE = {"processing": "bold green", "idle": "dim"}
RESULT_STYLE = {"swapped": "bold green", "accepted": "green", "refused": "bold red", "rolled_back": "bold yellow"}
KIND_STYLE = {"active": "bold green", "idle": "dim cyan", "free": "dim"}
REASON_LINES = 2      # a refusal's reason may take two lines of the event log


def pack(segments: list[Text], width: int) -> list[Text]:
    """Greedy line packing of short segments (never split), two spaces apart."""
    lines: list[Text] = []
    cur = Text()
    for seg in segments:
        if cur.cell_len and cur.cell_len + 2 + seg.cell_len > width:
            lines.append(cur)
            cur = Text()
        if cur.cell_len:
            cur.append("  ")
        cur.append_text(seg)
    lines.append(cur)
    for line in lines:
        line.no_wrap, line.overflow = True, "ellipsis"
    return lines


def _kv(label: str, value: str, style: str = "bold") -> Text:
    return Text.assemble((label + " ", "dim"), (value, style))


def _layout(h) -> Text:
    """`layout paged · f16`: the name, and its K/V element type when the server reports it (a swap
    to a layout of another type may change answers, one of the same type does not)."""
    seg = _kv("layout", h.layout, "bold magenta")
    if h.kv_type:
        seg.append(f" · {h.kv_type}", "magenta")
    return seg


def status_line(state: TopState) -> Text:
    if state.connected:
        return Text.assemble(("● live ", "bold green"), (state.url, "dim"))
    since = "" if state.down_since is None else f" for {state.now - state.down_since:.0f}s"
    what = "reconnecting" if state.has_data else "waiting for the server"
    return Text.assemble((f"⟳ {what}{since}: {state.error or 'no answer'} ", "bold red"), (state.url, "dim"))


def header(state: TopState, width: int) -> tuple[Group, int]:
    h = state.header
    version = h.layout_version[:8] if h.layout_version != "?" else "?"
    n_slots = len(state.slots) if state.slots else None
    bound = "" if h.uptime_exact or h.uptime_s is None else "≥"     # see track.Tracker.uptime
    segs = [
        _kv("model", h.model, "bold cyan"), _kv("dtype", h.dtype), _kv("device", h.device), _kv("cpu", h.cpu),
        _layout(h), _kv("v", version, "magenta"),
        _kv("uptime", bound + w.duration(h.uptime_s)), _kv("tok/s", w.rate(h.tokens_per_second), "bold green"),
        _kv("queue", w.num(h.queue_len)), _kv("active", f"{w.num(h.n_active)}/{w.num(n_slots)}"),
        _kv("kv", w.size(h.kv_bytes)),
        _kv("cache hit", "?" if h.cache_hit is None else f"{100 * h.cache_hit:.0f}%"),
    ]
    if h.ram_cache_bytes is not None:
        segs.append(_kv("ram cache", w.size(h.ram_cache_bytes)))
    lines = [status_line(state)] + pack(segs, width)
    lines[0].no_wrap, lines[0].overflow = True, "ellipsis"
    return Group(*lines), len(lines)


# column name, width, priority (lower is kept longer), right-justified
SLOT_COLUMNS = [("slot", 4, 0, True), ("state", 10, 0, False), ("gen", 5, 1, True), ("strm", 4, 2, True),
                ("prompt", 6, 3, True), ("cached", 6, 4, True), ("tok/s", 6, 3, True), ("elapsed", 7, 5, True)]
CTX_MIN = 12


def _fit(columns: list[tuple], width: int, reserve: int) -> list[tuple]:
    """The columns that fit in `width` next to `reserve` cells, dropping the highest priority first."""
    kept = list(columns)
    while kept and sum(c[1] + 1 for c in kept) + reserve > width:
        worst = max(range(len(kept)), key=lambda i: (kept[i][2], i))
        kept.pop(worst)
    return kept


def _fixed_columns(t: Table, cols: list[tuple]) -> None:
    """Columns that keep their width: rich would otherwise squeeze them to make room for a long
    last cell (a refusal's reason), since no_wrap content cannot shrink."""
    for name, cw, _, right in cols:
        t.add_column(name, width=cw, min_width=cw, max_width=cw, no_wrap=True,
                     justify="right" if right else "left", overflow="ellipsis")


def _slot_cell(s: SlotRow, name: str) -> Text | str:
    if name == "state":
        return Text(s.state, style=STATE_STYLE.get(s.state, "yellow"))
    values = {"slot": w.num(s.id), "strm": w.num(s.stream), "gen": w.num(s.n_generated),
              "prompt": w.num(s.n_prompt), "cached": w.num(s.n_cached), "tok/s": w.rate(s.tokens_per_second),
              "elapsed": w.duration(s.elapsed_s) if s.elapsed_s is not None else ""}
    return values[name]


def slots(state: TopState, width: int) -> tuple[Table, int]:
    cols = _fit(SLOT_COLUMNS, width, CTX_MIN)
    ctx_w = max(4, width - sum(c[1] + 1 for c in cols))
    t = Table(box=None, padding=(0, 1, 0, 0), expand=True, show_edge=False, header_style="bold")
    _fixed_columns(t, cols)
    t.add_column("context", no_wrap=True, overflow="crop", ratio=1)
    for s in state.slots:
        used = f" {w.num(s.cells_used)}/{w.num(s.n_ctx)}"
        fill = w.bar(s.cells_used, s.n_ctx, max(1, ctx_w - len(used) - 1), "green" if s.active else "cyan")
        t.add_row(*(_slot_cell(s, c[0]) for c in cols), Text.assemble(fill, used))
    if not state.slots:
        t.add_row(*([""] * len(cols)), Text("no slots in the answer", style="dim"))
    return t, 1 + max(1, len(state.slots))


def _stream_row(c: StreamCell, slots_by_id: dict[int, SlotRow], bar_w: int) -> Text:
    style = KIND_STYLE[c.kind]
    label = Text(f"s{c.stream:<3}", style="bold" if c.kind == "active" else "dim")
    if c.kind == "free":
        who = "free" if c.slot is None else f"free (slot {c.slot}, empty)"
        return Text.assemble(label, ("·" * bar_w, "dim"), (f" {who}", "dim"))
    s = slots_by_id.get(c.slot)
    what = "processing" if c.kind == "active" else "idle, cached"
    fill = w.bar(c.cells_used, c.n_ctx, bar_w, "green" if c.kind == "active" else "cyan")
    task = f" task {s.id_task}" if s is not None and s.active and s.id_task is not None else ""
    return Text.assemble(label, fill, (f" slot {c.slot} {what}{task} {c.cells_used}/{w.num(c.n_ctx)}", style))


def defrag_lines(state: TopState) -> list[Text]:
    """The engine's copy counters and the last remap seen between two polls: when, how many
    copies it took, and which slots moved where."""
    d = state.defrag
    head = Text.assemble(("defrag ", "dim"), (state.header.defrag, "bold"),
                         f"  copies {w.num(d.moves_total)} ({w.size(d.bytes_total)})")
    if d.last_at is None:
        return [head]
    ago = w.duration(max(0.0, state.now - d.last_at))
    head.append(f"  last +{d.last_copies} ({w.size(d.last_bytes)}) {ago} ago", style="yellow")
    moves = ", ".join(f"slot {m.slot} s{m.src}→s{m.dst}" for m in d.last_moves) or "no slot changed stream"
    return [head, Text(f"moved: {moves}", style="yellow")]


def streams(state: TopState, width: int) -> tuple[Group, int]:
    by_id = {s.id: s for s in state.slots}
    bar_w = max(4, min(24, width // 3))
    rows = [_stream_row(c, by_id, bar_w) for c in state.streams]
    rows += defrag_lines(state)
    for r in rows:
        r.no_wrap, r.overflow = True, "ellipsis"
    return Group(*rows), len(rows)


def history(state: TopState, width: int) -> tuple[Group, int]:
    spark_w = max(0, width - 24)
    tps, step = list(state.tps_history), list(state.step_history)
    lines = [
        Text.assemble(("tok/s   ", "dim"), (w.sparkline(tps, spark_w), "green"),
                      (f" {w.rate(tps[-1] if tps else None)} max {w.rate(max(tps, default=None))}", "bold")),
        Text.assemble(("step ms ", "dim"), (w.sparkline(step, spark_w), "magenta"),
                      (f" {w.ms(step[-1] if step else None)} max {w.ms(max(step, default=None))}", "bold")),
    ]
    for line in lines:
        line.no_wrap, line.overflow = True, "ellipsis"
    return Group(*lines), 2


KERNEL_COLUMNS = [("op", 15, 0, False), ("impl", 6, 3, False), ("version", 12, 1, False),
                  ("mean ms", 8, 2, True), ("calls", 8, 4, True), ("path", 24, 5, False)]


def _check(k: KernelRow) -> Text:
    if k.check is None:
        return Text("-", style="dim")
    reason = f" {k.check_reason}" if k.check_reason and k.check != "swapped" else ""
    return Text.assemble((k.check, RESULT_STYLE.get(k.check, "")), (reason, "dim"))


def kernels(state: TopState, width: int) -> tuple[Table, int]:
    cols = _fit(KERNEL_COLUMNS, width, 10)
    t = Table(box=None, padding=(0, 1, 0, 0), expand=True, show_edge=False, header_style="bold")
    _fixed_columns(t, cols)
    t.add_column("last check", no_wrap=True, overflow="ellipsis", ratio=1)
    for k in state.kernels:
        cells = {"op": k.op, "impl": k.impl, "version": Text(k.version, style="magenta"),
                 "mean ms": w.ms(k.mean_ms), "calls": w.num(k.calls), "path": Text(k.path or "-", style="dim")}
        t.add_row(*(cells[c[0]] for c in cols), _check(k))
    return t, 1 + max(1, len(state.kernels))


def _clock(stamp: float | None) -> str:
    """HH:MM:SS of a Unix time; a server may send any number, so one out of range prints dashes."""
    try:
        return time.strftime("%H:%M:%S", time.localtime(stamp)) if stamp is not None else "--:--:--"
    except (OverflowError, OSError, ValueError):
        return "--:--:--"


def events(state: TopState, width: int) -> tuple[Group, int]:
    """Newest first, two lines each: what happened where, then the reason (or the latency)."""
    lines: list[Text] = []
    for e in state.events:
        when = _clock(e.time)
        first = Text.assemble((when + " ", "dim"), (f"{e.result:<8}", RESULT_STYLE.get(e.result, "")),
                              f" {e.kind} {e.name} ", (e.where, "cyan"))
        detail = e.reason or (f"{e.latency_ms:.0f} ms" if e.latency_ms is not None else "")
        if e.version:
            detail = f"v {e.version[:8]}  {detail}"
        lines.append(first)
        style = "red" if e.result == "refused" else "dim"
        lines.extend(Text(("  ↳ " if i == 0 else "    ") + part, style=style)
                     for i, part in enumerate(chunks(detail, width - 4, REASON_LINES)))
    if not lines:
        lines.append(Text("no reloads yet (save a file in kernels/ or layouts/, or press r)", style="dim"))
    for line in lines:
        line.no_wrap, line.overflow = True, "ellipsis"
    return Group(*lines), len(lines)


def chunks(text: str, width: int, max_lines: int) -> list[str]:
    """`text` cut into lines of `width` cells (at spaces when possible), at most `max_lines`;
    the last line is cut short with an ellipsis by the caller's overflow setting."""
    width = max(width, 8)
    out: list[str] = []
    rest = " ".join(text.split())
    while rest and len(out) < max_lines - 1 and len(rest) > width:
        cut = rest.rfind(" ", width // 2, width + 1)
        cut = cut if cut > 0 else width
        out.append(rest[:cut])
        rest = rest[cut:].lstrip()
    out.append(rest)
    return out


def footer(state: TopState, _width: int) -> tuple[Text, int]:
    nxt = state.next_layout() or "?"
    t = Text.assemble(("q", "bold"), " quit  ", ("l", "bold"), f" layout→{nxt}  ", ("r", "bold"), " reload")
    if state.message:
        t.append(f"  │ {state.message}", style="yellow")
    if state.problems:
        t.append(f"  │ ⚠ {len(state.problems)} odd field(s): {state.problems[0]}", style="yellow")
    t.no_wrap, t.overflow = True, "ellipsis"
    return t, 1
