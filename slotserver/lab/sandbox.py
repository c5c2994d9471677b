"""Run a check in a forked child with a time limit: a kernel that never returns is killed.

On CUDA (`run_isolated(..., device="cuda")`) the check runs on a thread instead: CUDA cannot be
used in a forked child of a process that initialized it. A thread cannot be killed, so a GPU
kernel that never returns is reported after the time limit and left running (its stream is the
check's own, not the engine's).

Why fork: a Python thread cannot be stopped, and a fresh interpreter costs seconds (torch import);
a fork costs tens of milliseconds and sees every module already imported. The child runs torch on
one thread (OpenMP's worker pool does not survive a fork) and reports a JSON-able dict through a
pipe; anything else it does dies with it.
"""

from __future__ import annotations

import json
import os
import select
import signal
import threading
import time
import traceback
from typing import Callable


def run_isolated(fn: Callable[[], dict], timeout: float, device: str = "cpu") -> dict:
    """-> fn()'s dict, or {"ok": False, "reason": ...}: forked on the CPU, on a thread on CUDA."""
    return run_forked(fn, timeout) if device == "cpu" else run_threaded(fn, timeout)


def run_threaded(fn: Callable[[], dict], timeout: float) -> dict:
    """fn() on a daemon thread with a time limit (CUDA: see the module's docstring)."""
    box: list[dict] = []

    def target() -> None:
        try:
            box.append(fn())
        except BaseException as e:  # noqa: BLE001 - reported to the caller
            box.append({"ok": False, "reason": f"{type(e).__name__}: {e}", "trace": traceback.format_exc(limit=5)})

    t = threading.Thread(target=target, name="slotserver-lab-check", daemon=True)
    t.start()
    t.join(timeout)
    if not box:
        return {"ok": False, "reason": f"time limit: no answer within {timeout:.1f} s (a kernel that never returns?)"}
    return json.loads(json.dumps(box[0], default=str))   # the same JSON-able dict a fork would give


def run_forked(fn: Callable[[], dict], timeout: float) -> dict:
    """-> fn()'s dict, or {"ok": False, "reason": ...} on timeout, crash or exception."""
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        os.close(read_fd)
        _child(fn, write_fd)
    os.close(write_fd)
    try:
        return _collect(pid, read_fd, timeout)
    finally:
        os.close(read_fd)


def _child(fn: Callable[[], dict], write_fd: int) -> None:
    code = 0
    try:
        import torch

        torch.set_num_threads(1)
        result = fn()
    except BaseException as e:  # noqa: BLE001 - reported to the parent
        result = {"ok": False, "reason": f"{type(e).__name__}: {e}", "trace": traceback.format_exc(limit=5)}
    try:
        os.write(write_fd, json.dumps(result, default=str).encode())
    except BaseException:  # noqa: BLE001
        code = 1
    os._exit(code)


def _collect(pid: int, fd: int, timeout: float) -> dict:
    deadline = time.monotonic() + timeout
    chunks = []
    while True:
        left = deadline - time.monotonic()
        ready, _, _ = select.select([fd], [], [], max(left, 0))
        if not ready:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return {"ok": False, "reason": f"time limit: no answer within {timeout:.1f} s (a kernel that never returns?)"}
        data = os.read(fd, 1 << 16)
        if not data:
            break
        chunks.append(data)
    _, status = os.waitpid(pid, 0)
    if not chunks:
        return {"ok": False, "reason": f"the check process died (status {status})"}
    return json.loads(b"".join(chunks))
