"""Run a check in a forked child with a time limit: a kernel that never returns is killed.

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
import time
import traceback
from typing import Callable


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
