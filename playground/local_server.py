"""What the playground's comparison scripts share: where the llama.cpp peer and the reference
models are, a free port, waiting for /health, and a JSON POST. (Tests keep their own copies: tests
import nothing from playground/, and read only tests/fixtures/.)

The peer and the models are outside the repository (a llama.cpp build and real GGUF files, hundreds
of MB): set `LLAMA_CPP_DIR` (a llama.cpp source tree with its `build/bin`) and `SLOTSERVER_MODELS`,
or let them default to where the team's build tools put them under ~/.cache. Only the scripts that
compare against llama.cpp or regenerate fixtures need them; the fixtures they write are committed
in tests/fixtures/."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
import urllib.request
from pathlib import Path


_CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
LLAMA_CPP = Path(os.environ.get("LLAMA_CPP_DIR") or _CACHE / "slotserver-peer/llama_cpp_python-0.3.36/vendor/llama.cpp")
PEER = LLAMA_CPP / "build" / "bin"      # llama-server, llama-bench, ...
MODELS = Path(os.environ.get("SLOTSERVER_MODELS") or _CACHE / "slotserver-models")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(port: int, what: str, proc: subprocess.Popen | None = None, timeout_s: float = 120.0) -> None:
    """Until GET /health answers 200; RuntimeError naming `what` if it does not in time (or the
    process `proc` exits first)."""
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{what} exited with status {proc.returncode} before it was healthy")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"{what} did not start within {timeout_s:.0f} s")


def post(port: int, path: str, body: dict, timeout_s: float = 600.0) -> dict:
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout_s) as r:
        return json.loads(r.read())
