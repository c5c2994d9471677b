"""`render(state, width, height)`: one frame of the monitor, a pure function of its arguments.

Panels are planned before anything is drawn: each has a natural height (from panels.py) and a
priority; the frame keeps the most important panels whose minimum heights fit and drops the
rest, so a 40x12 terminal shows the header, the slots and the footer instead of a crash or a
smear. From 110 columns the panels sit in two columns (lab on the right). While disconnected,
every panel keeps the last data, dimmed, and the header says why.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

from rich.console import Console, ConsoleOptions, Group, RenderableType, RenderResult
from rich.layout import Layout
from rich.panel import Panel
from rich.text import Text

from slotserver.top import panels
from slotserver.top.model import TopState

WIDE = 110            # from this width: two columns
MIN_W, MIN_H = 20, 4  # below this, one line of text
BOX_HEADER_H = 20     # below this height the header loses its frame (two lines for the slots)
BORDER = 2            # a panel's frame: two lines, and two columns plus one of padding each side


@dataclass
class Part:
    """A planned panel: what to draw, its natural and minimum heights, priority (0 = keep most)."""

    name: str
    build: Callable[[TopState, int], tuple[RenderableType, int]]
    priority: int
    min_body: int = 1     # content lines it needs to be worth showing
    flexible: bool = False  # takes the leftover height (the event log)
    boxed: bool = True


HEADER = Part("slotserver top", panels.header, 0)
FOOTER = Part("keys", panels.footer, 1, boxed=False)
LEFT = [Part("slots", panels.slots, 2, 2), Part("KV streams", panels.streams, 3, 2),
        Part("throughput / step time", panels.history, 6, 2)]
RIGHT = [Part("kernels", panels.kernels, 5, 2), Part("lab events", panels.events, 4, 2, flexible=True)]


class Frame:
    """Draws `layout` at exactly `width` x `height`, whatever the console's own size."""

    def __init__(self, layout: RenderableType, width: int, height: int) -> None:
        self.layout, self.width, self.height = layout, width, height

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        yield from console.render(self.layout, options.update(width=min(self.width, options.max_width),
                                                               height=self.height))


def render(state: TopState, width: int, height: int) -> RenderableType:
    if width < MIN_W or height < MIN_H:
        text = Text("slotserver top: terminal too small" if state.connected else "top: reconnecting",
                    no_wrap=True, overflow="ellipsis")
        return Frame(text, max(width, 1), max(height, 1))
    dim = not state.connected
    head, head_h = _built(HEADER if height >= BOX_HEADER_H else replace(HEADER, boxed=False), state, width, dim)
    foot, _ = _built(FOOTER, state, width, dim)
    room = height - head_h - 1
    root = Layout(name="root")
    if room < 3:      # only the header (cropped if need be) and the keys
        root.split_column(Layout(head, ratio=1), Layout(foot, size=1))
        return Frame(root, width, height)
    if not state.has_data:
        body = Layout(Panel(Text("no answer from the server yet; asking again every poll", style="dim"),
                            border_style="dim"), name="body")
    elif width >= WIDE:
        left_w = width * 11 // 20
        left = _column(LEFT, state, left_w, room, dim)
        left.size = left_w
        body = Layout(name="body")
        body.split_row(left, _column(RIGHT, state, width - left_w, room, dim))
    else:
        body = _column(LEFT + RIGHT, state, width, room, dim)
    root.split_column(Layout(head, size=head_h), body, Layout(foot, size=1))
    return Frame(root, width, height)


def _built(part: Part, state: TopState, width: int, dim: bool) -> tuple[RenderableType, int]:
    """The part's renderable (boxed, dimmed when stale) and the lines it wants."""
    inner = max(1, width - 2 * BORDER) if part.boxed else width
    content, lines = part.build(state, inner)
    if not part.boxed:
        if dim and isinstance(content, Text):
            content.stylize("dim")
        return content, lines
    stale = part is HEADER and not state.connected and state.has_data
    title = part.name + (" — stale data, reconnecting" if stale else "")
    panel = Panel(content, title=title, title_align="left", style="dim" if dim else "",
                  border_style="dim" if dim else ("blue" if part is not HEADER else "bold blue"))
    return panel, lines + 2


def _column(parts: list[Part], state: TopState, width: int, height: int, dim: bool) -> Layout:
    """A column of the parts that fit in `height`, in the given order, dropped by priority.

    The flexible part (the event log) takes the height left over; without one, blank space does."""
    kept = _fit([(p, *_built(p, state, width, dim)) for p in parts], height)
    children = [Layout(panel, ratio=1, minimum_size=size) if p.flexible else Layout(panel, size=size)
                for p, panel, size in kept]
    if not any(p.flexible for p, _, _ in kept):
        children.append(Layout(Group(), ratio=1, minimum_size=0))   # blank (a Text("") is falsy)
    col = Layout()
    col.split_column(*children)
    return col


def _fit(built: list[tuple[Part, RenderableType, int]], height: int) -> list[tuple[Part, RenderableType, int]]:
    """Keep parts by priority while their sizes fit; a part that does not fit whole is shrunk to
    the room left when that still shows its minimum, else dropped. Display order is preserved."""
    room = height
    chosen: dict[str, int] = {}
    for p, _, want in sorted(built, key=lambda b: b[0].priority):
        need = 2 + p.min_body
        want = need if p.flexible else want     # it grows into the leftover later
        if room >= want:
            chosen[p.name] = want
        elif room >= need:
            chosen[p.name] = room
        else:
            continue
        room -= chosen[p.name]
    return [(p, panel, chosen[p.name]) for p, panel, _ in built if p.name in chosen]
