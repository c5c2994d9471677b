"""The ranks of `--tp N` and their process group (gloo, on the CPU).

Two ways to get N ranks:
- one machine, `slotserver serve --tp N` (or `generate --tp N`): the process is rank 0 and starts
  ranks 1..N-1 itself, the same command line in `python -m slotserver.cli.main` subprocesses, with
  torch.distributed's environment (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR=127.0.0.1, a free
  MASTER_PORT). Each rank takes its share of the cores when `-t` is left at 0.
- torchrun (one node or several: its `--nnodes`, `--node-rank`, `--master-addr` and rendezvous):
  `torchrun --nproc-per-node 2 -m slotserver.cli.main serve --tp 2 ...`; the ranks come from its
  environment, and --tp must equal WORLD_SIZE.

Why no timeout on the process group's waits: a worker waits for rank 0's next step as long as the
server is idle (hours). A spawned worker watches its parent instead and leaves when it is gone;
under torchrun, its agent ends the other ranks when one fails.
"""

from __future__ import annotations

import atexit
import datetime
import os
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass

import torch.distributed as dist

from slotserver.errors import ConfigError
from slotserver.parallel.comm import Comm

PARENT_ENV = "SLOTSERVER_TP_PARENT"
FOREVER = datetime.timedelta(days=3650)


@dataclass(frozen=True)
class Ranks:
    rank: int
    world: int
    local_world: int   # ranks on this machine (they share its cores)


def start(tp: int, argv: list[str]) -> tuple[Comm, Ranks] | None:
    """The process group of `--tp tp` (None without --tp > 1 and outside torchrun)."""
    env = os.environ
    if tp < 0:
        raise ConfigError(f"--tp must be >= 1, got {tp}")
    if tp and "WORLD_SIZE" in env and "RANK" in env:   # torchrun, or spawned by rank 0 below
        ranks = Ranks(int(env["RANK"]), int(env["WORLD_SIZE"]), int(env.get("LOCAL_WORLD_SIZE", env["WORLD_SIZE"])))
        if ranks.world != tp:
            raise ConfigError(f"--tp {tp} but WORLD_SIZE is {ranks.world}: give torchrun as many processes as --tp")
        if PARENT_ENV in env:
            _watch_parent(int(env[PARENT_ENV]))
    elif tp > 1:
        ranks = Ranks(0, tp, tp)
        _spawn(tp, argv)
    else:
        return None
    dist.init_process_group("gloo", rank=ranks.rank, world_size=ranks.world, timeout=FOREVER)
    atexit.register(_close)
    return Comm(ranks.rank, ranks.world), ranks


def _spawn(tp: int, argv: list[str]) -> None:
    """Ranks 1..tp-1 as subprocesses of this one (which becomes rank 0), ended when it exits."""
    port = _free_port()
    base = dict(os.environ, WORLD_SIZE=str(tp), LOCAL_WORLD_SIZE=str(tp), MASTER_ADDR="127.0.0.1",
                MASTER_PORT=str(port), **{PARENT_ENV: str(os.getpid())})
    os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE=str(tp), LOCAL_WORLD_SIZE=str(tp),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    children = [subprocess.Popen([sys.executable, "-m", "slotserver.cli.main", *argv],
                                 env=dict(base, RANK=str(r), LOCAL_RANK=str(r)), stdout=subprocess.DEVNULL)
                for r in range(1, tp)]
    atexit.register(_reap, children)


def _reap(children: list[subprocess.Popen]) -> None:
    """Rank 0 exits: its workers were told to stop (or will see it gone); wait a moment, then end them."""
    deadline = time.monotonic() + 10
    for c in children:
        try:
            c.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            c.kill()


def _close() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _watch_parent(pid: int) -> None:
    """Leave when rank 0 (the parent that spawned this rank) is gone: nothing else would end the wait."""
    def watch() -> None:
        while os.getppid() == pid:
            time.sleep(0.5)
        os._exit(1)
    threading.Thread(target=watch, name="slotserver-tp-parent", daemon=True).start()
