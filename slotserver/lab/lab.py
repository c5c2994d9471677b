"""The live lab: validated hot swaps of kernels and KV layouts between two engine steps.

Flow: a save (watcher) or a request (HTTP, `reload`/`switch_layout`) -> validation in a forked,
time-limited child on the lab's worker thread -> on success a swap is queued -> the engine applies
it at the start of its next step (`apply_pending`), migrating every slot's KV through the layouts'
canonical export/import for a layout swap. A refused edit leaves the old version serving. Every
acceptance, swap and refusal is an event (file, line, reason, latency) for HTTP and the TUI.
"""

from __future__ import annotations

import collections
import itertools
import logging
import queue
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout   # not the builtin before Python 3.11
from pathlib import Path

from slotserver.runtime.kernel_paths import cpu_report, kernel_path
from slotserver.runtime.kernel_set import load_kernel
from slotserver.runtime.layouts import LAYOUT_CONTRACT, available_layouts
from slotserver.runtime.loader import (ModuleLoadError, Source, default_dir, file_version, load_source,
                                   locate, module_names, read_source, resolve_in_folder, users_of)
from slotserver.lab.sandbox import run_isolated
from slotserver.lab.validate import validate_kernel, validate_layout

log = logging.getLogger("slotserver.lab")


class Lab:
    def __init__(self, port, kernels_dir: Path | None, layouts_dir: Path | None,
                 validation_timeout: float = 5.0) -> None:
        self.port = port   # the engine's verbs (slotserver.engine.port.EnginePort): no engine internals here
        self.kernels_dir = Path(kernels_dir or default_dir("kernels"))
        self.layouts_dir = Path(layouts_dir or default_dir("layouts"))
        self.timeout = validation_timeout
        self.events: collections.deque[dict] = collections.deque(maxlen=500)
        self.counts = collections.Counter()
        self._seq = itertools.count(1)
        self._lock = threading.Lock()
        self._pending: queue.SimpleQueue = queue.SimpleQueue()
        self._worker = ThreadPoolExecutor(1, thread_name_prefix="slotserver-lab")
        self._previous_kernels = None
        self._closed = False

    # -- requests (any thread) --------------------------------------------------------------------
    def reload(self, path: str | None = None, observed: float | None = None) -> Future:
        """Validate and swap in one edited file (or every file whose content changed)."""
        observed = observed or time.perf_counter()
        return self._worker.submit(self._reload, path, observed)

    def switch_layout(self, name: str) -> Future:
        return self._worker.submit(self._switch_layout, name, time.perf_counter())

    def events_since(self, seq: int = 0) -> list[dict]:
        with self._lock:
            return [e for e in self.events if e["seq"] > seq]

    def snapshot(self) -> dict:
        ks = self.port.kernels
        mean = ks.mean_ms()
        return {
            "device": self.port.device_name(),
            "layout": self.port.layout_info(),
            "layouts": available_layouts(self.layouts_dir),
            "kernels": [{"op": op, "impl": ks.impl, "version": m.version, "file": str(m.path),
                         "parts": [*m.c_files, *m.parts],   # the files beside it that are part of it
                         "path": kernel_path(m.module, ks.impl),
                         "mean_ms": mean.get(op, 0.0), "calls": int(ks.timings.get(op, [0])[0])}
                        for op, m in sorted(ks.modules.items())],
            "cpu": cpu_report({op: m.module for op, m in ks.modules.items()}, ks.impl),
            "events": self.events_since(0)[-50:],
            "stats": {"reloads": dict(self.counts)},
            "engine": self.port.stats().to_dict(),
            "dirs": {"kernels": str(self.kernels_dir), "layouts": str(self.layouts_dir)},
        }

    # -- the engine thread ----------------------------------------------------------------------
    def has_pending(self) -> bool:
        """Whether a swap waits for the next step boundary (an overlapped engine lands its step first)."""
        return not self._pending.empty()

    def apply_pending(self) -> None:
        while True:
            try:
                swap, fut = self._pending.get_nowait()
            except queue.Empty:
                return
            try:
                fut.set_result(swap())
            except Exception as e:  # noqa: BLE001 - a swap that fails leaves the old version
                fut.set_result(self._event("refused", "swap", "", "", reason=f"swap failed: {e}"))

    def forward_ok(self) -> None:
        """A step ran on the current kernels: they are proven, nothing to roll back to any more."""
        self._previous_kernels = None

    def may_roll_back(self) -> bool:
        """Whether the next step runs kernels just swapped in, which a failure would roll back."""
        return self._previous_kernels is not None

    def rollback(self, error: Exception) -> bool:
        """A step failed right after a kernel swap: serve the previous kernels again."""
        previous, self._previous_kernels = self._previous_kernels, None
        if previous is None:
            return False
        self.port.swap_kernels(previous)
        self._event("rolled_back", "kernel", "", "", reason=f"step failed after the swap: {type(error).__name__}: {error}")
        return True

    # -- worker thread -------------------------------------------------------------------------
    def _reload(self, path: str | None, observed: float) -> dict:
        if path is None:
            results = [self._reload(str(p), observed) for p in self._changed_files()]
            return {"reloaded": results}
        users = self._part_users(path)
        if users is not None:   # a kernel's C file or part: every serving kernel that uses it
            return {"reloaded": [self._reload_kernel(self.kernels_dir / f"{n}.py", observed) for n in users]}
        where = locate(path, {"kernel": self.kernels_dir, "layout": self.layouts_dir})
        if where is None:  # never imported, not even by the validator
            return self._event("refused", "file", Path(str(path)).stem[:100], str(path)[:300],
                               reason="not a module the lab lists: only <name>.py files inside the "
                                      f"kernels folder ({self.kernels_dir}) or the layouts folder ({self.layouts_dir})")
        kind, name = where
        if kind == "kernel":
            return self._reload_kernel(self.kernels_dir / f"{name}.py", observed)
        return self._reload_layout(self.layouts_dir / f"{name}.py", observed)

    def _part_users(self, path: str) -> list[str] | None:
        """For a `.c` file or a part (`_<name>.py`) in the kernels folder: the serving kernels whose
        source names it (they compile or load it: a save re-validates each); None for any other path."""
        try:
            p = Path(path)
            if not (p.suffix == ".c" or (p.suffix == ".py" and p.name.startswith("_"))) \
                    or p.parent.resolve() != self.kernels_dir.resolve():
                return None
        except (OSError, ValueError, RuntimeError):
            return None
        serving = self.port.kernels.modules
        return [n for n in users_of(self.kernels_dir, p.name) if n in serving]

    def _changed_files(self) -> list[Path]:
        layout = self.port.layout
        serving = {str(m.path): m.version for m in self.port.kernels.modules.values()}
        serving[str(layout.path)] = layout.version
        out = []
        listed = [self.kernels_dir / f"{n}.py" for n in module_names(self.kernels_dir)]
        for f in listed + [layout.path]:
            try:
                if file_version(f) != serving.get(str(f)):
                    out.append(f)
            except (OSError, ModuleLoadError):
                continue
        return out

    def _reload_kernel(self, p: Path, observed: float) -> dict:
        ks = self.port.kernels
        op = p.stem
        if op not in ks.modules:
            return self._event("refused", "kernel", op, str(p), reason=f"no serving kernel '{op}' (new ops need a model change)")
        try:
            src = read_source(p)            # read once: these bytes are validated, then swapped in
        except ModuleLoadError as e:
            return self._event("refused", "kernel", op, str(p), reason=str(e))
        trusted = ks.modules[op].module    # the serving module, inherited by the fork
        device = self.port.device
        check = run_isolated(lambda: validate_kernel(src, trusted, ks.impl, device), self.timeout, device)
        if not check.get("ok"):
            return self._event("refused", "kernel", op, str(p), reason=check.get("reason"), line=check.get("line"))
        try:
            loaded = load_kernel(src)
        except ModuleLoadError as e:
            return self._event("refused", "kernel", op, str(p), reason=str(e))

        def swap() -> dict:
            try:
                self._previous_kernels = self.port.swap_kernels(self.port.kernels.with_module(op, loaded))
            except ModuleLoadError as e:   # --tp: a rank could not load it; every rank keeps the old one
                return self._event("refused", "kernel", op, str(p), reason=str(e))
            return self._event("swapped", "kernel", op, str(p), version=loaded.version,
                               max_err=check.get("max_err"), latency_ms=1000 * (time.perf_counter() - observed))

        return self._queue(swap)

    def _reload_layout(self, p: Path, observed: float) -> dict:
        try:
            src = read_source(p)
        except ModuleLoadError as e:
            return self._event("refused", "layout", p.stem, str(p), reason=str(e))
        check = self._validate_layout(src)
        if not check.get("ok"):
            return self._event("refused", "layout", p.stem, str(p), reason=check.get("reason"), line=check.get("line"))
        if p.resolve() != Path(self.port.layout.path).resolve():
            return self._event("accepted", "layout", p.stem, str(p), version=src.version, reason="valid; not the serving layout")
        return self._swap_layout(src, observed)

    def _switch_layout(self, name: str, observed: float) -> dict:
        try:
            src = read_source(resolve_in_folder(self.layouts_dir, name, "layout"))
        except ModuleLoadError as e:  # a path, '..', a separator, a symlink out: nothing is imported
            return self._event("refused", "layout", str(name)[:100], "", reason=str(e))
        check = self._validate_layout(src)
        if not check.get("ok"):
            return self._event("refused", "layout", name, str(src.path), reason=check.get("reason"), line=check.get("line"))
        return self._swap_layout(src, observed)

    def _validate_layout(self, src: Source) -> dict:
        mods = self.port.kernels.modules
        attn = mods["attention"].module
        paged = mods["paged_attention"].module if "paged_attention" in mods else None
        return run_isolated(lambda: validate_layout(src, attn, paged), self.timeout, "cpu")   # layouts: checked on the CPU

    def _swap_layout(self, src: Source, observed: float) -> dict:
        """The validated bytes become a module here; the engine thread migrates every slot's KV."""
        try:
            loaded = load_source(src, LAYOUT_CONTRACT)
        except ModuleLoadError as e:
            return self._event("refused", "layout", src.path.stem, str(src.path), reason=str(e))

        def migrate() -> dict:
            try:
                moved = self.port.swap_layout(loaded)
            except ModuleLoadError as e:   # --tp: a rank could not make it; every rank keeps the old one
                return self._event("refused", "layout", loaded.module.NAME, str(loaded.path), reason=str(e))
            return self._event("swapped", "layout", loaded.module.NAME, str(loaded.path), version=loaded.version,
                               migrated_cells=moved, latency_ms=1000 * (time.perf_counter() - observed))

        return self._queue(migrate)

    def _queue(self, swap) -> dict:
        """Hand `swap` to the engine thread; -> its event once a step boundary ran it. Once the
        engine stopped (`close`), no step will: the swap is refused instead of waiting (a save seen
        by the watcher as the engine stops kept the lab's worker, and the interpreter's exit
        that joins it, waiting for 600 s)."""
        fut: Future = Future()
        self._pending.put((swap, fut))
        self.port.wake()
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            try:
                return fut.result(timeout=0.2)
            except FutureTimeout:
                if self._closed:
                    self._refuse_pending("the engine stopped before the swap")
        return fut.result(timeout=0)   # raises TimeoutError: the engine never reached a step boundary

    def close(self) -> None:
        """The engine stopped: refuse what waits for a step, start no new validation."""
        self._closed = True
        self._refuse_pending("the engine stopped before the swap")
        self._worker.shutdown(wait=False, cancel_futures=True)

    def _refuse_pending(self, reason: str) -> None:
        while True:
            try:
                _, fut = self._pending.get_nowait()
            except queue.Empty:
                return
            if not fut.done():
                fut.set_result(self._event("refused", "swap", "", "", reason=reason))

    def _event(self, result: str, kind: str, name: str, file: str, line: object = None, **extra) -> dict:
        """Record an event for /lab/events and top, and log it: the server's own log shows every
        swap and refusal too. `line` is always there, an int or None (a validator says "?")."""
        with self._lock:
            event = {"seq": next(self._seq), "time": time.time(), "result": result, "kind": kind,
                     "name": name, "file": file, "line": line_number(line),
                     **{k: v for k, v in extra.items() if v is not None}}
            self.events.append(event)
            self.counts[result] += 1
        log_event(event)
        return event


def line_number(line: object) -> int | None:
    """A source line as an int (1-based), or None when unknown ("?", a non-number, 0)."""
    if isinstance(line, str) and line.strip().isdigit():
        line = int(line)
    return line if isinstance(line, int) and not isinstance(line, bool) and line > 0 else None


def log_event(event: dict) -> None:
    """One log line per lab event: a warning for what did not take effect, else info."""
    where = event["file"] + (f":{event['line']}" if event["line"] and event["file"] else "")
    parts = [f"lab: {event['result']} {event['kind']} {event['name']}".rstrip()]
    if event.get("version"):
        parts.append(f"version {event['version']}")
    if event.get("latency_ms") is not None:
        parts.append(f"in {event['latency_ms']:.0f} ms")
    text = " ".join(parts) + (f" ({where})" if where else "") + (f": {event['reason']}" if event.get("reason") else "")
    log.log(logging.WARNING if event["result"] in ("refused", "rolled_back") else logging.INFO, "%s", text)

