"""Issue 32's probe: layout swaps under streaming load, through HTTP, as `serve` runs (dtype auto).

8 clients stream greedy completions while the layout keeps switching through every float layout:
every text equals the one the server gives on an idle server (layouts of one element type give the
same floats). A layout of another element type (q8) says so in /lab.
"""

from __future__ import annotations

import json
import threading
import time

import pytest

from slotserver.runtime.layouts import available_layouts
from smollm_server import smollm_client

PROMPTS = ["The capital of France is", "Once upon a time", "def add(a, b):", "The primary colors are",
           "Water boils at", "My favorite book is", "In 1969,", "A list of fruits:"]
FLOAT_LAYOUTS = [n for n in available_layouts() if n != "q8"]
N_PREDICT = 24


def _stream(client, prompt: str) -> str:
    body = {"prompt": prompt, "n_predict": N_PREDICT, "temperature": 0, "stream": True, "cache_prompt": False}
    text = []
    with client.stream("POST", "/completion", json=body) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: "):
                text.append(json.loads(line[6:]).get("content", ""))
    return "".join(text)


def _load(client, rounds: int, got: dict, errors: list) -> list[threading.Thread]:
    def worker(i: int) -> None:
        try:
            for r in range(rounds):
                got[(i, r)] = _stream(client, PROMPTS[i])
        except Exception as e:  # noqa: BLE001 - reported by the test
            errors.append(repr(e))
    threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(PROMPTS))]
    for t in threads:
        t.start()
    return threads


def test_layout_swaps_under_streaming_load_keep_greedy_text():
    with smollm_client(n_parallel=8, ctx_size=8 * 128, dtype="auto") as (client, engine):
        want = {i: _stream(client, p) for i, p in enumerate(PROMPTS)}
        got, errors = {}, []
        threads = _load(client, 3, got, errors)
        swaps, k = 0, 0
        while any(t.is_alive() for t in threads):
            r = client.post("/lab/layout", json={"layout": FLOAT_LAYOUTS[k % len(FLOAT_LAYOUTS)]})
            assert r.status_code == 200, r.text
            swaps, k = swaps + 1, k + 1
            time.sleep(0.05)
        for t in threads:
            t.join()
        assert not errors, errors
        assert swaps >= len(FLOAT_LAYOUTS), "the load ended before a whole round of swaps"
        changed = {key: text for key, text in got.items() if text != want[key[0]]}
        assert not changed, f"{len(changed)} of {len(got)} texts changed across {swaps} swaps: {changed}"
        assert client.get("/lab").json()["layout"]["kv_type"] in ("f16", "bf16", "f32")


def test_a_layout_of_another_element_type_says_so():
    with smollm_client(n_parallel=2, ctx_size=512, dtype="auto") as (client, engine):
        before = client.get("/lab").json()["layout"]
        assert client.post("/lab/layout", json={"layout": "q8"}).status_code == 200
        after = client.get("/lab").json()["layout"]
    assert before["kv_type"] == "f16"   # the serving default cache type, llama.cpp's
    assert after["name"] == "q8" and after["kv_type"].startswith("q8") and after["kv_type"] != before["kv_type"]
