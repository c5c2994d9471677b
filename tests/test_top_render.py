"""`slotserver top` frames drawn from recorded `/lab` and `/props` answers, read as text.

The fixtures are real answers of a tiny-model server (paths rewritten): `top_lab_busy` (three
slots decoding), `top_lab_defrag` (half a second later: slot 0 finished and its cache was parked
on the spare stream 3, slot 2 moved down to stream 0), `top_lab_gap` (defrag off, slot 1's cache
erased between two busy slots), all with the lab events of a few kernel edits (three refused).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import httpx
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from rich.console import Console

from slotserver.top import widgets
from slotserver.top.client import Poll, TopClient
from slotserver.top.model import TopState
from slotserver.top.render import render

FIXTURES = Path(__file__).parent / "fixtures"
URL = "http://127.0.0.1:8080"


def load(name: str):
    return json.loads((FIXTURES / f"top_{name}.json").read_text())


def state_from(*labs: str, props: dict | None = None, step: float = 0.5) -> TopState:
    props = load("props") if props is None else props
    state = TopState(url=URL)
    for i, name in enumerate(labs):
        state.apply(Poll(100.0 + i * step, lab=load(name), props=props, health="ok"))
    return state


def frame(state: TopState, width: int = 120, height: int = 40) -> str:
    console = Console(record=True, width=width, height=height, file=open("/dev/null", "w"))
    console.print(render(state, width, height))
    return console.export_text()


def panel_lines(text: str, title: str) -> list[str]:
    """The lines of the panel titled `title` (its box's column), without the frame."""
    lines = text.splitlines()
    top = next(i for i, line in enumerate(lines) if f"╭─ {title} " in line)
    left = lines[top].index(f"╭─ {title} ")
    right = lines[top].index("╮", left)
    out = []
    for line in lines[top + 1:]:
        cell = line[left:right + 1]
        if cell.startswith("╰"):
            return out
        out.append(cell[2:-2])   # without the frame and its one-column padding
    return out


def test_slot_rows_show_state_tokens_and_context_fill():
    lab = load("lab_busy")
    rows = panel_lines(frame(state_from("lab_busy")), "slots")
    assert rows[0].split()[:4] == ["slot", "state", "gen", "strm"], rows[0]
    for s in lab["engine"]["slots"]:
        pattern = (rf"^\s*{s['id']} processing\s+{s['n_generated']}\s+{s['stream']}\s+{s['n_prompt']}"
                   rf"\s+{s['n_cached']}\s.*█.*\s{s['cells_used']}/{s['n_ctx']}\s*$")
        assert any(re.search(pattern, r) for r in rows), (pattern, rows)


def test_header_shows_model_layout_rate_and_unknowns():
    busy, later = load("lab_busy")["engine"], load("lab_defrag")["engine"]
    text = frame(state_from("lab_busy", "lab_defrag"))
    header = " ".join(panel_lines(text, "slotserver top"))
    assert "● live" in header and URL in header
    assert "model tiny.gguf" in header and "device cpu" in header
    assert "dtype ?" in header                       # /props has no dtype: shown as unknown
    assert "layout seq_head_dim  v 35020c3e" in header
    rate = (later["predicted_tokens"] - busy["predicted_tokens"]) / 0.5   # counters over the poll gap
    assert f"tok/s {widgets.rate(rate)}" in header
    assert "queue 0" in header and "active 2/3" in header
    assert f"uptime {widgets.duration(later['uptime_s'])}" in header      # seen to move: exact
    first = " ".join(panel_lines(frame(state_from("lab_busy")), "slotserver top"))
    assert f"uptime ≥{widgets.duration(busy['uptime_s'])}" in first       # maybe stale: a bound
    assert "tok/s ?" in first                                             # a rate needs two polls


def test_stream_map_shows_a_gap_between_active_streams():
    rows = panel_lines(frame(state_from("lab_gap")), "KV streams")
    s0, s1, s2 = (next(r for r in rows if r.startswith(f"s{i} ")) for i in range(3))
    assert "slot 0 processing" in s0 and "189/256" in s0 and "█" in s0
    assert "free" in s1 and "█" not in s1 and "····" in s1
    assert "slot 2 processing" in s2 and "184/256" in s2
    assert rows.index(s0) < rows.index(s1) < rows.index(s2)
    assert not any(r.startswith("s3 ") for r in rows)          # defrag off: no spare stream
    assert any("defrag off" in r for r in rows)


def test_defrag_moves_are_derived_between_polls():
    rows = panel_lines(frame(state_from("lab_busy", "lab_defrag")), "KV streams")
    streams = {r.split()[0]: r for r in rows if re.match(r"s\d ", r)}
    assert "slot 2 processing" in streams["s0"] and "slot 1 processing" in streams["s1"]
    assert "free" in streams["s2"] and "█" not in streams["s2"]
    assert "slot 0 idle, cached 55/256" in streams["s3"]
    counters = next(r for r in rows if r.startswith("defrag on"))
    assert "copies 2 (50.5 KiB)" in counters and "last +2 (50.5 KiB)" in counters
    assert any(r.startswith("moved: slot 2 s2→s0, slot 0 s0→s3") for r in rows), rows


def test_event_log_shows_refusals_with_reason_and_line():
    rows = panel_lines(frame(state_from("lab_busy")), "lab events")
    text = " ".join(r.strip() for r in rows)         # a long reason wraps onto a second line
    assert re.search(r"refused\s+kernel rms_norm rms_norm\.py:28", text), text
    assert "NameError: name 'undefined_name' is not defined" in text
    assert "max error 0.0349 > tolerance 4.49e-05" in text
    assert text.index("rms_norm.py:28") < text.index("max error 0.0349")     # newest first


def test_kernel_table_shows_versions_and_last_check():
    lab = load("lab_busy")
    rows = panel_lines(frame(state_from("lab_busy")), "kernels")
    for k in lab["kernels"]:
        row = next(r for r in rows if r.split()[0] == k["op"])
        assert k["version"] in row, row
    assert next(r for r in rows if r.startswith("rms_norm")).rstrip().endswith("swapped")  # seq 7 wins
    assert next(r for r in rows if r.startswith("rope")).rstrip().endswith("-")            # never edited


@pytest.mark.parametrize("width,height", [(40, 12), (60, 16), (80, 24), (109, 30), (110, 30), (200, 8),
                                          (30, 60), (20, 4), (19, 30), (12, 3), (1, 1)])
def test_small_and_odd_terminals_draw_within_bounds(width, height):
    text = frame(state_from("lab_busy", "lab_defrag"), width, height)
    lines = text.splitlines()
    assert len(lines) <= height
    assert all(len(line) <= width for line in lines)
    if (width, height) == (40, 12):          # the panels that matter most survive
        assert "processing" in text and "q quit" in text and "layout seq_head_dim" in text


def test_lost_server_keeps_the_last_frame_dimmed():
    state = state_from("lab_busy")
    state.apply(Poll(101.0, health="down", error="cannot connect"))
    text = frame(state)
    assert "reconnecting" in text and "cannot connect" in text
    assert re.search(r"1 processing\s+34\s+1\s+13", text)        # last data still there
    console = Console(width=120, height=40, file=open("/dev/null", "w"))
    segments = [s for s in console.render(render(state, 120, 40)) if "processing" in s.text]
    assert segments and all(s.style and s.style.dim for s in segments)


def answers(*bodies):
    """A mock transport: /lab answers with the given bodies in turn, /health and /props fine."""
    queue = list(bodies)

    def handle(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/health":
            return httpx.Response(200, json={"status": "ok"})
        if request.url.path == "/props":
            return httpx.Response(200, json=load("props"))
        body = queue.pop(0) if len(queue) > 1 else queue[0]
        if isinstance(body, int):
            return httpx.Response(body, json={"error": {"code": body, "message": "Invalid API Key"}})
        if isinstance(body, bytes):
            return httpx.Response(200, content=body)
        return httpx.Response(200, json=body)

    return httpx.MockTransport(handle)


def polled(*bodies) -> TopState:
    client = TopClient(URL, "secret", transport=answers(*bodies))
    state = TopState(url=URL)
    for _ in bodies:
        state.apply(client.poll())
    return state


def test_non_json_answer_shows_the_error_and_keeps_data():
    text = frame(polled(load("lab_busy"), b"<html>502 Bad Gateway</html>"))
    assert "reconnecting" in text and "not JSON" in text and "stale data" in text
    assert "slot 0 processing" in text and "model tiny.gguf" in text


def test_rejected_key_is_explained():
    text = frame(polled(401))
    assert "waiting for the server" in text and "401: Invalid API Key" in text


def test_wrong_shapes_render_what_they_can():
    lab = load("lab_busy")
    lab["engine"]["slots"][1] = "not a slot"
    lab["kernels"] = {"rms_norm": "?"}
    lab["events"].append({"result": "refused", "kind": "layout", "name": "q9", "reason": "shape mismatch",
                          "seq": "x", "time": "yesterday"})
    lab["layout"] = ["seq_head_dim"]
    text = frame(polled(lab))
    assert "slot 0 processing" in text and "slot 2 processing" in text
    assert "shape mismatch" in text and "--:--:--" in text
    assert "odd field(s)" in text and "● live" in text
    assert frame(polled([1, 2, 3])).count("expected a JSON object") == 1


def test_control_characters_from_the_server_never_reach_the_terminal():
    lab = load("lab_busy")
    lab["events"].append({"seq": 99, "result": "refused", "kind": "kernel", "name": "rope\x1b[2J",
                          "file": "rope.py", "reason": "bad\x1b]0;pwned\x07 line\nbreak"})
    console = Console(width=120, height=40, force_terminal=True, record=True, file=open("/dev/null", "w"))
    console.print(render(polled(lab), 120, 40))
    raw = console.export_text(styles=True)
    assert "\x1b]0;" not in raw and "\x1b[2J" not in raw and "\x07" not in raw
    assert "bad�]0;pwned� line�break" in raw        # shown, defused


JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
                    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=8), kids, max_size=4),
                    max_leaves=12)
SLOT = st.fixed_dictionaries({}, optional={k: JSON | st.integers(-3, 300) for k in
                                           ("id", "stream", "state", "cells_used", "n_ctx", "id_task")})
LAB = st.fixed_dictionaries({}, optional={
    "engine": JSON | st.fixed_dictionaries({}, optional={"slots": st.lists(SLOT, max_size=5) | JSON,
                                                         "defrag": st.sampled_from(["on", "off"]) | JSON,
                                                         "predicted_tokens": JSON, "timings": JSON}),
    "layout": JSON, "layouts": JSON, "kernels": st.lists(JSON, max_size=3) | JSON,
    "events": st.lists(st.dictionaries(st.sampled_from(["result", "kind", "name", "file", "line", "reason",
                                                        "seq", "time", "latency_ms"]), JSON), max_size=4)})


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(labs=st.lists(LAB | JSON, min_size=1, max_size=3), props=JSON,
       width=st.integers(1, 150), height=st.integers(1, 50))
@example(labs=[{"events": [{"time": 6.8e16}]}], props=None, width=20, height=10)  # past localtime's range
@example(labs=[{"events": [{"time": -1e300}]}], props=None, width=20, height=10)
def test_any_json_renders_within_bounds(labs, props, width, height):
    state = TopState(url=URL)
    for i, lab in enumerate(labs):
        state.apply(Poll(float(i), lab=lab, props=props, health="ok"))
    lines = frame(state, width, height).splitlines()
    assert len(lines) <= height and all(len(line) <= width for line in lines)


def test_header_shows_the_prompt_cache_hit_rate_and_the_ram_cache():
    """What came from a cache over all prompt tokens (the engine's counters), and --cache-ram's
    size; a server that does not report them shows `?` and no RAM segment."""
    lab = load("lab_busy")
    lab["engine"].update(prompt_tokens=250, prompt_tokens_cached=750, ram_cache_bytes=3 << 20)
    state = TopState(url=URL)
    state.apply(Poll(100.0, lab=lab, props=load("props"), health="ok"))
    header = " ".join(panel_lines(frame(state), "slotserver top"))
    assert "cache hit 75%" in header and f"ram cache {widgets.size(3 << 20)}" in header
    plain = " ".join(panel_lines(frame(state_from("lab_busy")), "slotserver top"))
    assert "cache hit ?" in plain and "ram cache" not in plain
