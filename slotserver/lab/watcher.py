"""Watch `kernels/` and `layouts/` with watchdog and hand debounced saves to the lab.

The folders are watched (not the files), so an editor's save-by-rename (write a temp file, rename
it over the original) counts as a save of the original. Several events within `debounce` seconds
for one file make one reload; its latency is measured from the first event.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

from watchdog.events import FileSystemEvent, FileSystemEventHandler
from watchdog.observers import Observer


class _Handler(FileSystemEventHandler):
    def __init__(self, watcher: "Watcher") -> None:
        self.watcher = watcher

    def on_any_event(self, event: FileSystemEvent) -> None:
        if event.event_type not in ("created", "modified", "moved", "closed"):
            return
        path = getattr(event, "dest_path", "") or event.src_path
        if isinstance(path, bytes):
            path = path.decode()
        p = Path(path)
        # .c: a kernel's C file; _<name>.py: a kernel's part (not __init__.py or a dot file)
        if p.suffix in (".py", ".c") and not p.name.startswith((".", "__")):
            self.watcher.touched(p)


class Watcher:
    def __init__(self, lab, folders: list[Path], debounce: float = 0.1) -> None:
        self.lab, self.debounce = lab, debounce
        self._first: dict[Path, float] = {}
        self._timers: dict[Path, threading.Timer] = {}
        self._lock = threading.Lock()
        self._observer = Observer()
        for folder in folders:
            self._observer.schedule(_Handler(self), str(folder), recursive=False)

    def start(self) -> "Watcher":
        self._observer.start()
        return self

    def stop(self) -> None:
        self._observer.stop()
        self._observer.join(timeout=5)
        with self._lock:
            for t in self._timers.values():
                t.cancel()

    def touched(self, path: Path) -> None:
        with self._lock:
            self._first.setdefault(path, time.perf_counter())
            if path in self._timers:
                self._timers[path].cancel()
            timer = threading.Timer(self.debounce, self._fire, args=(path,))
            timer.daemon = True
            self._timers[path] = timer
            timer.start()

    def _fire(self, path: Path) -> None:
        with self._lock:
            observed = self._first.pop(path, time.perf_counter())
            self._timers.pop(path, None)
        if path.exists():
            self.lab.reload(str(path), observed=observed)
