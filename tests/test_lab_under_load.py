"""The lab under load, as issue 32 probed it: `serve --lab DIR`, 8 greedy clients looping, and a
valid kernel edit saved again and again. Every save must be swapped in.

Why a real server process: the refusals came from the engine thread recording a step graph while
the lab's thread loaded the edit (and from the validation child forked meanwhile), which only a
serving process under load interleaves (`'_Watched' object has no attribute 'argtypes'`; the issue
saw 1 save in 5 refused at one save every 3 s). tests/test_step_graph.py has the unit-level race.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import threading
import time

import gguf
import httpx
import pytest
from tiny_gguf import write_tiny_gguf

from slotserver.runtime.loader import default_dir
from test_server_e2e import Server, free_port, wait_ready

# The next save follows each swap at once: a swap drops the step graphs, so the engine records new
# ones while the lab validates (forks) and loads that save. At this cadence the unfixed server
# refused 6 or 7 of these 30 saves (3 runs on a 2-core host); they take ~6 s, the server's start ~10 s.
CLIENTS, SAVES = 8, 30
PROMPTS = [f"Client {i} asks: what comes after {i}?" for i in range(CLIENTS)]


@pytest.fixture(scope="module")
def lab_server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("labload")
    for kind in ("kernels", "layouts"):
        shutil.copytree(default_dir(kind), tmp / "lab" / kind)
    model = write_tiny_gguf(tmp / "tiny.gguf", tensor_type=gguf.GGMLQuantizationType.Q8_0, n_layers=4, ctx_len=1024)
    port, log = free_port(), tmp / "server.log"
    cmd = [sys.executable, "-m", "slotserver.cli.main", "serve", "-m", str(model), "--lab", str(tmp / "lab"),
           "-np", str(CLIENTS), "-c", str(CLIENTS * 128), "--port", str(port)]
    with log.open("w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
    server = Server(f"http://127.0.0.1:{port}", proc, log, tmp)
    try:
        wait_ready(server)
        yield server, tmp / "lab" / "kernels" / "rms_norm.py"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()


def _next_event(server: Server, after: int, timeout: float = 60.0) -> dict:
    """The first swapped or refused lab event with seq > `after`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        new = [e for e in server.get("/lab").json()["events"]
               if e["seq"] > after and e["result"] in ("swapped", "refused")]
        if new:
            return new[0]
        time.sleep(0.02)
    raise AssertionError(f"no lab event after seq {after}:\n{server.log.read_text()[-3000:]}")


def _client(url: str, prompt: str, stop: threading.Event, answers: list) -> None:
    """Greedy completions of one prompt, back to back until `stop`: (status, text) each."""
    with httpx.Client(timeout=120) as http:
        while not stop.is_set():
            r = http.post(url + "/completion", json={"prompt": prompt, "n_predict": 12, "temperature": 0})
            answers.append((r.status_code, r.json().get("content") if r.status_code == 200 else r.text))


def test_every_kernel_save_under_load_is_swapped_in(lab_server):
    server, kfile = lab_server
    stop = threading.Event()
    answers: dict[str, list] = {p: [] for p in PROMPTS}
    clients = [threading.Thread(target=_client, args=(server.url, p, stop, answers[p])) for p in PROMPTS]
    for t in clients:
        t.start()
    events = []
    try:
        while sum(map(len, answers.values())) < CLIENTS:    # every client is generating
            time.sleep(0.05)
        seq = max((e["seq"] for e in server.get("/lab").json()["events"]), default=0)
        for i in range(SAVES):
            with kfile.open("a") as f:
                f.write(f"# save {i} under load\n")     # a comment: valid, same numbers
            event = _next_event(server, seq)
            seq = event["seq"]
            events.append(event)
    finally:
        stop.set()
        for t in clients:
            t.join(timeout=120)
    refused = [e.get("reason") for e in events if e["result"] != "swapped"]
    assert refused == [], f"{len(refused)} of {SAVES} saves refused"
    assert all(e["name"] == "rms_norm" for e in events)
    for prompt, got in answers.items():
        assert {status for status, _ in got} == {200}, got
        assert len({text for _, text in got}) == 1, (prompt, got)   # a comment changes no answer
