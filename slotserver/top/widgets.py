"""Small text widgets: sparklines, fill bars, and number formats where unknown reads "?"."""

from __future__ import annotations

import math
from typing import Iterable

from rich.text import Text

from slotserver.top.rows import UNKNOWN

SPARKS = "▁▂▃▄▅▆▇█"
FULL, EMPTY = "█", "░"
PARTIAL = " ▏▎▍▌▋▊▉"      # eighths of a cell, for smooth fill bars


def sparkline(values: Iterable[float], width: int) -> str:
    """The last `width` values as unicode blocks scaled to their maximum; zero is a blank."""
    vals = list(values)[-width:] if width > 0 else []
    top = max(vals, default=0.0)
    if top <= 0:
        return " " * len(vals)
    out = []
    for v in vals:
        if v <= 0:
            out.append(" ")
        else:
            out.append(SPARKS[min(len(SPARKS) - 1, int(v / top * (len(SPARKS) - 1) + 0.5))])
    return "".join(out)


def bar(used: int | None, total: int | None, width: int, style: str = "green") -> Text:
    """A fill bar `width` cells wide, in eighths of a cell; unknown amounts draw an empty bar."""
    width = max(width, 0)
    if not used or not total or total <= 0:
        return Text(EMPTY * width, style="dim")
    eighths = round(min(max(used / total, 0.0), 1.0) * width * 8)
    full, part = divmod(eighths, 8)
    filled = FULL * full + (PARTIAL[part] if part and full < width else "")
    return Text.assemble((filled, style), (EMPTY * (width - len(filled)), "dim"))


def num(v: float | int | None, spec: str = "d") -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return UNKNOWN
    return format(v, spec)


def rate(v: float | None) -> str:
    if v is None:
        return UNKNOWN
    return f"{v:.0f}" if v >= 100 else f"{v:.1f}"


def ms(v: float | None) -> str:
    if v is None:
        return UNKNOWN
    return f"{v:.0f}" if v >= 100 else (f"{v:.2f}" if v < 1 else f"{v:.1f}")


def size(n: int | None) -> str:
    if n is None:
        return UNKNOWN
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return UNKNOWN  # pragma: no cover - the loop always returns


def duration(s: float | None) -> str:
    if s is None or not math.isfinite(s) or s < 0:
        return UNKNOWN
    if s < 60:
        return f"{s:.1f}s"
    m, sec = divmod(int(s), 60)
    if m < 60:
        return f"{m}m{sec:02d}s"
    h, m = divmod(m, 60)
    return f"{h}h{m:02d}m"
