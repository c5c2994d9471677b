"""A slot save killed at any moment leaves the previous file or the new one, never a torn one.

A child process saves large payloads in a loop through `atomic_file.atomic_write` (the helper
`save` uses), writing each in small slow chunks so that a kill almost always lands mid-write,
and is SIGKILLed at seeded random moments. After each kill the file must be whole and hold the
last version the child reported done, or the one it was writing when killed. The temporary file
such a kill leaves is removed by `remove_stale_temporaries` (server start, next save), which
never removes the temporary of a save still running.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from slotserver.engine.atomic_file import atomic_write, remove_stale_temporaries

SIZE, CHUNKS = 1 << 20, 64       # 1 MiB per version, written in 64 chunks
HEADER = 12                      # b"v%010d\n"

CHILD = """
import sys, time
from pathlib import Path
from slotserver.engine.atomic_file import atomic_write

path, version, size, chunks = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])

def writer(v):
    def write(f):
        f.write(b"v%010d\\n" % v)
        block = bytes([v % 251]) * (size // chunks)
        for _ in range(chunks):
            f.write(block)
            f.flush()
            time.sleep(0.002)
    return write

print("ready", flush=True)
while True:
    version += 1
    atomic_write(path, writer(version))
    print(version, flush=True)
"""


def payload(version: int) -> bytes:
    return b"v%010d\n" % version + bytes([version % 251]) * SIZE


def read_version(path: Path) -> int:
    """The version the file holds; fails if the file is torn (short, empty or mixed)."""
    data = path.read_bytes()
    assert len(data) == HEADER + SIZE, f"torn file: {len(data)} bytes"
    version = int(data[1:HEADER - 1])
    assert data == payload(version), f"file of version {version} has wrong contents"
    return version


def kill_mid_save(path: Path, start: int, delay: float, keep_temps: bool = False) -> tuple[int, bool]:
    """Run the child from version `start`, SIGKILL it `delay` s after it is ready;
    -> (last version it reported done, whether a write was in flight: a temporary file is left).
    The temporary is deleted unless `keep_temps`."""
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(path), str(start), str(SIZE), str(CHUNKS)],
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "ready"
        time.sleep(delay)
    finally:
        os.kill(child.pid, signal.SIGKILL)
        out, _ = child.communicate()
    done = [int(line) for line in out.split()]
    temps = [p for p in path.parent.iterdir() if p.name.startswith(f".{path.name}.tmp-")]
    for p in temps if not keep_temps else ():
        p.unlink()
    return (done[-1] if done else start), bool(temps)


@pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs SIGKILL")
def test_a_save_killed_at_any_moment_keeps_a_whole_file(tmp_path):
    path = tmp_path / "slot.bin"
    atomic_write(path, lambda f: f.write(payload(0)))
    rng, version, mid_write = random.Random(0), 0, 0
    for _ in range(5):
        done, in_flight = kill_mid_save(path, version, rng.uniform(0.05, 0.5))
        now = read_version(path)
        assert now in (done, done + 1), f"file holds version {now}, child had finished {done}"
        version, mid_write = now, mid_write + in_flight
    assert mid_write >= 3, "the kills did not land mid-write, so the test proved nothing"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["slot.bin"]


def test_a_failing_write_leaves_the_old_file_and_no_temporary(tmp_path):
    path = tmp_path / "slot.bin"
    atomic_write(path, lambda f: f.write(payload(1)))

    def half_then_fail(f):
        f.write(payload(2)[: SIZE // 2])
        raise KeyboardInterrupt  # even a BaseException cleans up

    with pytest.raises(KeyboardInterrupt):
        atomic_write(path, half_then_fail)
    assert read_version(path) == 1
    assert [p.name for p in tmp_path.iterdir()] == ["slot.bin"]


@pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs SIGKILL")
def test_the_temporary_a_killed_save_leaves_is_removed(tmp_path):
    """Issue 32: a kill -9 mid-save left its temporary (up to a whole slot, 177 MB) forever."""
    path = tmp_path / "slot.bin"
    atomic_write(path, lambda f: f.write(payload(0)))
    for delay in (0.2, 0.3, 0.1, 0.4, 0.25):
        version, in_flight = kill_mid_save(path, read_version(path), delay, keep_temps=True)
        if in_flight:
            break
    assert in_flight, "no kill landed mid-write, so the test proved nothing"
    assert len(list(tmp_path.iterdir())) == 2
    assert [n.startswith(".slot.bin.tmp-") for n in remove_stale_temporaries(tmp_path)] == [True]
    assert [p.name for p in tmp_path.iterdir()] == ["slot.bin"] and read_version(path) in (version, version + 1)


def test_cleanup_keeps_the_temporary_of_a_save_running_in_this_process(tmp_path):
    """A save on another thread is mid-write while cleanup runs (as the next save's would):
    its temporary is this process's, yet live, so it stays and the save completes."""
    path, writing, finish = tmp_path / "slot.bin", threading.Event(), threading.Event()

    def slow(f):
        f.write(payload(7)[:SIZE // 2])
        writing.set()
        assert finish.wait(30)
        f.write(payload(7)[SIZE // 2:])

    saver = threading.Thread(target=atomic_write, args=(path, slow))
    saver.start()
    try:
        assert writing.wait(30)
        assert remove_stale_temporaries(tmp_path) == []
        assert [p.name.startswith(".slot.bin.tmp-") for p in tmp_path.iterdir()] == [True]
    finally:
        finish.set()
        saver.join(30)
    assert read_version(path) == 7 and [p.name for p in tmp_path.iterdir()] == ["slot.bin"]
