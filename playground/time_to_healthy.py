"""Time to healthy and resident memory: slotserver vs llama-server on the same GGUF file.

Starts each server in turn (alternating, `--rounds` times) with the same context and slot count,
polls GET /health until 200, then sends one short completion (so every weight page has been
touched) and reads VmRSS of the server process. Prints medians and ratios.

    .venv/bin/python playground/time_to_healthy.py --llama-server PATH [--model F.gguf] [--rounds 3] [-- extra slotserver flags]
"""

from __future__ import annotations

import argparse
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def measure(argv: list[str], port: int, timeout: float = 120.0) -> tuple[float, float, float]:
    """-> (seconds to healthy, RSS MiB when healthy, RSS MiB after one completion)."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        while time.perf_counter() - t0 < timeout:
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if proc.poll() is not None:
                raise RuntimeError(f"{argv[0]} exited with {proc.returncode}")
            time.sleep(0.02)
        healthy, rss0 = time.perf_counter() - t0, rss_mib(proc.pid)
        httpx.post(url + "/completion", json={"prompt": "Hello, my name is", "n_predict": 8}, timeout=60)
        return healthy, rss0, rss_mib(proc.pid)
    finally:
        proc.terminate()
        proc.wait(30)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--llama-server", required=True)
    ap.add_argument("--model", default=None)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("-c", "--ctx-size", type=int, default=4096)
    ap.add_argument("-np", "--parallel", type=int, default=4)
    ap.add_argument("extra", nargs="*", help="more slotserver serve flags (after --)")
    args = ap.parse_args()
    if args.model is None:
        from slotserver.model.default_model import default_model_path
        args.model = str(default_model_path())
    common = ["-m", args.model, "-c", str(args.ctx_size), "-np", str(args.parallel)]
    servers = {
        "slotserver": lambda p: [sys.executable, "-m", "slotserver.cli.main", "serve", *common, "--port", str(p),
                                 "--no-watch", *args.extra],
        "llama-server": lambda p: [args.llama_server, *common, "--port", str(p)],
    }
    rows: dict[str, list[tuple[float, float, float]]] = {k: [] for k in servers}
    for _ in range(args.rounds):
        for name, argv in servers.items():
            port = free_port()
            rows[name].append(measure(argv(port), port))
    print(f"model {Path(args.model).name}, -c {args.ctx_size} -np {args.parallel}, median of {args.rounds} alternating rounds")
    print(f"{'server':14}{'healthy s':>11}{'RSS MiB':>10}{'after 1 req':>13}")
    med = {k: [statistics.median(r[i] for r in v) for i in range(3)] for k, v in rows.items()}
    for name, (h, r0, r1) in med.items():
        print(f"{name:14}{h:11.2f}{r0:10.0f}{r1:13.0f}")
    s, l = med["slotserver"], med["llama-server"]
    print(f"{'ratio s/l':14}{s[0] / l[0]:11.2f}{s[1] / l[1]:10.2f}{s[2] / l[2]:13.2f}")


if __name__ == "__main__":
    main()
