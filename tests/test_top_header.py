"""`slotserver top`'s header: the dtype from /props, the serving layout's K/V element type from
/lab (when the server reports one), and lab event lines as ints or null (old servers sent "?")."""

from __future__ import annotations

import copy

from test_server_api import make_client, tiny_engine  # noqa: F401  (a fixture)
from test_top_render import frame, load, panel_lines

from slotserver.top.client import Poll
from slotserver.top.model import TopState
from slotserver.top.parse import parse_events

URL = "http://127.0.0.1:8080"


def header_of(lab: dict, props: dict) -> str:
    state = TopState(url=URL)
    state.apply(Poll(100.0, lab=lab, props=props, health="ok"))
    return " ".join(panel_lines(frame(state), "slotserver top"))


def test_header_shows_the_dtype_from_props():
    props = {**load("props"), "dtype": "float32", "weights": "q"}
    assert "dtype float32" in header_of(load("lab_busy"), props)


def test_header_shows_the_kv_type_next_to_the_layout_when_reported():
    lab = copy.deepcopy(load("lab_busy"))
    assert "·" not in header_of(lab, load("props"))              # not reported: nothing shown
    lab["layout"]["kv_type"] = "f16"
    assert f"layout {lab['layout']['name']} · f16  v" in header_of(lab, load("props"))
    lab["layout"]["kv_type"] = "q8 (int8, f32 scale per row) and a much longer tail"
    assert "· q8 (int8, f32 scale per row) an…" in header_of(lab, load("props"))   # cut to 32 characters
    lab["layout"]["kv_type"] = ["not", "a", "string"]            # a bad value: left out, no crash
    assert f"layout {lab['layout']['name']}  v" in header_of(lab, load("props"))


def test_layout_entries_may_be_objects_with_a_kv_type():
    lab = copy.deepcopy(load("lab_busy"))
    names = list(lab["layouts"])
    lab["layouts"] = [{"name": n, "kv_type": "f16"} for n in names] + [{"kv_type": "f32"}, 7]
    state = TopState(url=URL)
    state.apply(Poll(100.0, lab=lab, props=load("props"), health="ok"))
    assert state.layouts == names and state.next_layout() in names


def test_event_lines_are_ints_or_none_whatever_the_server_sent():
    raw = [{"seq": 1, "result": "refused", "kind": "kernel", "name": "k", "file": "/x/k.py", "line": None},
           {"seq": 2, "result": "refused", "kind": "kernel", "name": "k", "file": "/x/k.py", "line": "?"},
           {"seq": 3, "result": "refused", "kind": "kernel", "name": "k", "file": "/x/k.py", "line": 28}]
    rows = {e.seq: e for e in parse_events(raw, [])}
    assert (rows[1].line, rows[2].line, rows[3].line) == (None, None, 28)
    assert (rows[1].where, rows[2].where, rows[3].where) == ("k.py", "k.py", "k.py:28")


def test_top_shows_a_real_servers_dtype_and_kv_type(tiny_engine):
    with make_client(tiny_engine) as c:
        lab, props = c.get("/lab").json(), c.get("/props").json()
    header = header_of(lab, props)
    assert props["dtype"] in ("float32", "bfloat16") and f"dtype {props['dtype']}" in header
    assert lab["layout"]["kv_type"] and f"layout {lab['layout']['name']} · {lab['layout']['kv_type']}" in header
