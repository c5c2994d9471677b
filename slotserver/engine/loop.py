"""`EngineLoop`: the engine's thread and the lab's file watcher, apart from what a step does.

The loop calls `Engine.step()` until stopped; a step that raises fails the requests it ran (the
server keeps serving), and an idle engine sleeps on a wake event that every client message sets.
The watcher (with `watch`) turns saves under kernels/ and layouts/ into lab reloads; it starts
before `start()` returns, so that a save right after start is seen.
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from slotserver.engine.engine import Engine

log = logging.getLogger("slotserver.engine.engine")

IDLE_WAIT_S = 0.25   # an idle loop refreshes its stats (uptime, rates) this often


class EngineLoop:
    def __init__(self, engine: "Engine", wake: threading.Event) -> None:
        self.engine, self.wake = engine, wake
        self.thread: threading.Thread | None = None
        self.watcher = None
        self.stopping = False

    def start(self, watch: bool) -> None:
        """Run the loop on a new thread."""
        if watch:
            self.start_watcher()
        self.thread = threading.Thread(target=self.run, name="slotserver-engine", daemon=True)
        self.thread.start()

    def run(self) -> None:
        """The loop, on the calling thread, until `stop()`."""
        e = self.engine
        while not self.stopping:
            try:
                worked = e.step()
            except Exception as exc:  # noqa: BLE001 - a failed step fails its requests, not the server
                log.exception("engine step failed")
                e.inbox.fail_running(f"engine error: {type(exc).__name__}: {exc}")
                e.outbox.flush()
                worked = True
            if worked:
                e.sleeper.worked()
            else:
                if not e.sleeper.asleep:
                    e.tracker.publish()  # keep uptime and rates fresh while idle (asleep: the last snapshot)
                e.sleeper.maybe_sleep()
                self.wake.wait(IDLE_WAIT_S)
                self.wake.clear()
        try:
            e.settle()   # --async-steps: the step in flight's tokens still reach their requests
        except Exception:  # noqa: BLE001 - stopping: its requests fail as a failed step's would
            log.exception("engine step failed")
            e.inbox.fail_running("engine stopped")
            e.outbox.flush()

    def start_watcher(self) -> None:
        if self.watcher is not None or self.stopping:
            return
        from slotserver.lab.watcher import Watcher

        lab = self.engine.lab
        self.watcher = Watcher(lab, [lab.kernels_dir, lab.layouts_dir]).start()

    def stop(self) -> None:
        """Stop the watcher, then the loop (waiting for the step in flight)."""
        if self.watcher is not None:
            self.watcher.stop()
        self.stopping = True
        self.wake.set()
        if self.thread is not None:
            self.thread.join(timeout=30)
