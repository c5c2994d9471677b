"""A test file run as a script under Triton's interpreter, its results read back as JSON.

Why a subprocess: triton fixes interpret-or-compile at its first import, and the test process has
imported it compiled (or may yet). The script prints one line `MARK + json.dumps(results)`; a
failing script fails the caller with the end of its stderr.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path


def run_interpreted(script: str | Path, mark: str, *args, timeout: float = 300) -> dict:
    """`python script *args` with TRITON_INTERPRET=1 -> the JSON after `mark` on its last such line."""
    proc = subprocess.run([sys.executable, str(script), *map(str, args)], capture_output=True, text=True,
                          env=dict(os.environ, TRITON_INTERPRET="1"), timeout=timeout)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(mark)]
    assert proc.returncode == 0 and lines, proc.stderr[-3000:]
    return json.loads(lines[-1][len(mark):])


def usable_cores() -> int:
    """The CPUs this process may run on: 1 in a `make test` worker (tests/conftest.py pins each)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
