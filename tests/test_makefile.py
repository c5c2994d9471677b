"""`make serve` as the README documents it: plain (port 8080), and with PORT=... and ARGS=...
Checked with `make -n` (print, do not run): the last line is the serve command."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")


def serve_command(*assignments: str) -> str:
    """The command `make serve` would run (setup lines, if the stamp is stale, come before it)."""
    out = subprocess.run(["make", "-n", "serve", *assignments], cwd=ROOT, capture_output=True,
                         text=True, timeout=60, env={"PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr
    return out.stdout.strip().splitlines()[-1]


def test_make_serve_defaults_to_port_8080():
    assert serve_command().split() == [".venv/bin/slotserver", "serve", "--port", "8080"]


def test_make_serve_takes_port_and_args():
    line = serve_command("PORT=8123", "ARGS=-m model.gguf -np 2 --metrics")
    assert line.split() == [".venv/bin/slotserver", "serve", "--port", "8123", "-m", "model.gguf", "-np", "2",
                            "--metrics"]
