"""Telling the user what loading is doing: a progress bar on a terminal, log lines everywhere.

Loading and warming up take seconds (up to ~18 s on a busy host), and a server whose stderr is a
log file or a service's journal showed nothing until the final "listening" line. So each stage is
also a log line (`stage`, logger `slotserver.load`: shown by `serve`, which logs at INFO). On a
terminal the bar runs too, and log lines written meanwhile go through rich's stderr proxy, above
the bar, instead of being drawn over by it.
"""

from __future__ import annotations

import logging
import sys
import time
from contextlib import contextmanager
from typing import Callable, Iterator

log = logging.getLogger("slotserver.load")


@contextmanager
def stage(what: str, done: str) -> Iterator[None]:
    """Log `what...` now and `done in N s` when the block ends (not if it raises: the error says)."""
    log.info("%s...", what)
    start = time.perf_counter()
    yield
    log.info("%s in %.1f s", done, time.perf_counter() - start)


@contextmanager
def load_progress(label: str) -> Iterator[Callable[[int, int], None]]:
    if not sys.stderr.isatty():
        yield lambda done, total: None
        return
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    terminal = sys.stderr
    with Progress(TextColumn("{task.description}"), BarColumn(), _count_column(),
                  TimeElapsedColumn(), console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task(label, total=None)

        def tick(done: int, total: int) -> None:
            bar.update(task, completed=done, total=total)

        with _logging_moved(terminal, sys.stderr):   # to rich's proxy while the bar is live
            yield tick


def _count_column():
    """`done/total`, blank until the total is known (it showed `0/None` while the file opened)."""
    from rich.progress import ProgressColumn
    from rich.text import Text

    class Count(ProgressColumn):
        def render(self, task) -> Text:
            return Text("" if task.total is None else f"{int(task.completed)}/{int(task.total)}")

    return Count()


@contextmanager
def _logging_moved(old, new) -> Iterator[None]:
    """Point the root logger's handlers that write to `old` at `new` for the block, then back."""
    handlers = [h for h in logging.getLogger().handlers
                if isinstance(h, logging.StreamHandler) and getattr(h, "stream", None) is old]
    for h in handlers:
        h.setStream(new)
    try:
        yield
    finally:
        for h in handlers:
            h.setStream(old)
