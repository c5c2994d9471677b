"""JSON from `/lab` and `/props` -> rows, tolerating anything.

A monitor is most useful exactly when the server misbehaves, so nothing here raises on a bad
answer: a value of the wrong type reads as unknown, a section of the wrong shape is skipped and
named in `problems` (shown in the footer), and everything else is still parsed and drawn.
"""

from __future__ import annotations

import math
from typing import Any

from slotserver.top.rows import UNKNOWN, EventRow, Header, KernelRow, SlotRow


def clean(s: str, limit: int = 2000) -> str:
    """`s` without control or line-break characters (each becomes "�"), at most `limit` long.

    Why: these strings come from the network and go to a terminal; an escape sequence in an
    error message must not move the cursor or retitle the window, and a stray line break must not
    add lines to a table whose height was planned."""
    s = s[:limit]
    return s if s.isprintable() else "".join(ch if ch.isprintable() else "�" for ch in s)


def as_dict(v: Any) -> dict:
    return v if isinstance(v, dict) else {}


def as_int(v: Any) -> int | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        return None
    return int(v)


def as_float(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        return None
    return float(v)


def as_line(v: Any) -> int | None:
    """A source line: an int, or None for null (servers before issue 32 sent "?" for none)."""
    if isinstance(v, str) and v.strip().isdigit():
        v = int(v)
    n = as_int(v)
    return n if n is not None and n > 0 else None


def as_str(v: Any, default: str = UNKNOWN) -> str:
    if isinstance(v, str) and v:
        return clean(v)
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return str(v)
    return default


def section(parent: dict, key: str, kind: type, problems: list[str]):
    """parent[key] if it has the expected type; else an empty one, and a note when it was wrong."""
    v = parent.get(key)
    if isinstance(v, kind):
        return v
    if v is not None:
        problems.append(f"'{key}' is a {type(v).__name__}, expected a {kind.__name__}")
    return kind()


def parse_slots(raw: list, problems: list[str]) -> list[SlotRow]:
    rows = []
    for item in raw:
        d = as_dict(item)
        sid = as_int(d.get("id"))
        if sid is None:
            problems.append("a slot without an integer 'id'")
            continue
        rows.append(SlotRow(
            id=sid, stream=as_int(d.get("stream")), state=as_str(d.get("state")),
            id_task=as_int(d.get("id_task")), n_prompt=as_int(d.get("n_prompt")),
            n_cached=as_int(d.get("n_cached")), n_generated=as_int(d.get("n_generated")),
            cells_used=as_int(d.get("cells_used")), n_ctx=as_int(d.get("n_ctx")),
            tokens_per_second=as_float(d.get("tokens_per_second"))))
    return sorted(rows, key=lambda r: r.id)


def parse_events(raw: list, problems: list[str]) -> list[EventRow]:
    """Lab events, newest first (the server sends them oldest first)."""
    rows = []
    for item in raw:
        if not isinstance(item, dict):
            problems.append("an event that is not an object")
            continue
        reason = item.get("reason")
        rows.append(EventRow(
            seq=as_int(item.get("seq")), time=as_float(item.get("time")), result=as_str(item.get("result")),
            kind=as_str(item.get("kind")), name=as_str(item.get("name"), ""), file=as_str(item.get("file"), ""),
            line=as_line(item.get("line")),
            reason=None if reason is None else clean(str(reason)),
            latency_ms=as_float(item.get("latency_ms")), version=as_str(item.get("version"), "") or None))
    return sorted(rows, key=lambda e: -(e.seq if e.seq is not None else -1))


def parse_kernels(raw: list, events: list[EventRow], problems: list[str]) -> list[KernelRow]:
    """Kernel rows, each with the newest lab event about its op (its last validation result)."""
    last: dict[str, EventRow] = {}
    for e in events:                       # newest first: keep the first seen per op
        if e.kind == "kernel" and e.name:
            last.setdefault(e.name, e)
    rows = []
    for item in raw:
        d = as_dict(item)
        op = as_str(d.get("op"), "")
        if not op:
            problems.append("a kernel without an 'op'")
            continue
        ev = last.get(op)
        rows.append(KernelRow(
            op=op, impl=as_str(d.get("impl")), version=as_str(d.get("version")),
            mean_ms=as_float(d.get("mean_ms")), calls=as_int(d.get("calls")), path=as_str(d.get("path"), "") or None,
            check=ev.result if ev else None, check_reason=ev.reason if ev else None))
    return rows


def parse_header(lab: dict, engine: dict, props: dict, problems: list[str]) -> Header:
    """Header fields: the model from /props, the layout from /lab, the counters from the engine.

    /props says the compute `dtype` (servers before issue 32 did not: "?"); the device, if a server
    adds it, else the kernels' implementation name ("cpu", "triton"), which is chosen per device.
    The serving layout's `kv_type` (its K/V element type: "f16", "bf16"...) is shown when /lab has it.
    """
    layout = section(lab, "layout", dict, problems)
    kernels = lab.get("kernels") if isinstance(lab.get("kernels"), list) else []
    impl = next((as_str(as_dict(k).get("impl")) for k in kernels if as_dict(k).get("impl")), UNKNOWN)
    model = as_str(props.get("model_alias"), "") or as_str(props.get("model_path"))
    return Header(
        model=model.rsplit("/", 1)[-1], dtype=as_str(props.get("dtype")),
        device=as_str(props.get("device"), impl),
        layout=as_str(layout.get("name"), as_str(engine.get("layout"))),
        layout_version=as_str(layout.get("version")), kv_type=_short(as_str(layout.get("kv_type"), ""), 32),
        uptime_s=as_float(engine.get("uptime_s")),
        tokens_per_second=as_float(engine.get("tokens_per_second")),
        queue_len=as_int(engine.get("queue_len")), n_active=as_int(engine.get("n_active")),
        steps=as_int(engine.get("steps")), kv_bytes=as_int(layout.get("bytes", engine.get("kv_bytes"))),
        defrag=as_str(engine.get("defrag")), cpu=_cpu(as_dict(lab.get("cpu")) or as_dict(props.get("cpu"))),
        cache_hit=_hit_rate(engine), ram_cache_bytes=as_int(engine.get("ram_cache_bytes")))


def _hit_rate(engine: dict) -> float | None:
    """Prompt tokens taken from a cache over all prompt tokens (computed ones are `prompt_tokens`)."""
    cached, computed = as_int(engine.get("prompt_tokens_cached")), as_int(engine.get("prompt_tokens"))
    if cached is None or computed is None or cached + computed == 0:
        return None
    return cached / (cached + computed)


def _short(s: str, limit: int) -> str:
    return s if len(s) <= limit else s[:limit - 1] + "…"


def _cpu(report: dict) -> str:
    """"avx512", or "avx2 (forced)" when SLOTSERVER_CPU chose a smaller variant than the host's."""
    variant = as_str(report.get("variant"))
    return f"{variant} (forced)" if report.get("forced") is True else variant


def parse_layouts(lab: dict) -> list[str]:
    """The layout names, whether the list holds names or objects with a "name" (and a kv_type)."""
    raw = lab.get("layouts")
    names = [x.get("name") if isinstance(x, dict) else x for x in raw] if isinstance(raw, list) else []
    return [clean(x, 200) for x in names if isinstance(x, str) and x]
