"""The monitor's loop: poll, draw, wait for keys until the next poll; restore the terminal on exit.

The screen is rich's `Live` on the alternate screen (the shell's scrollback is left as it was);
keys come from `RawKeys`. Both are context managers, so whatever ends the loop (q, Ctrl-C, an
unexpected error) leaves the alternate screen, shows the cursor and restores the termios settings
before the exception goes on. The lab's verbs can take seconds (validation in a child process, then
the next engine step), so they run on a daemon thread: the frame keeps updating meanwhile and the
outcome appears in the footer.
"""

from __future__ import annotations

import threading
import time
from typing import Callable

from rich.console import Console
from rich.live import Live

from slotserver.top.client import TopClient
from slotserver.top.keys import RawKeys, actions
from slotserver.top.model import TopState
from slotserver.top.render import render

MIN_INTERVAL_S = 0.05


class Background:
    """At most one lab verb in flight; its one-line outcome is collected by the loop."""

    def __init__(self) -> None:
        self.thread: threading.Thread | None = None
        self.outcome: str | None = None

    def busy(self) -> bool:
        return self.thread is not None and self.thread.is_alive()

    def start(self, fn: Callable[[], str]) -> None:
        def run() -> None:
            self.outcome = fn()

        self.outcome = None
        self.thread = threading.Thread(target=run, name="slotserver-top-action", daemon=True)
        self.thread.start()

    def take(self) -> str | None:
        out, self.outcome = self.outcome, None
        return out


def handle(action: str, state: TopState, client: TopClient, bg: Background) -> bool:
    """Carry out one key action; -> False when the monitor should stop."""
    if action == "quit":
        return False
    if bg.busy():
        state.message = "busy: the previous request has not answered yet"
    elif action == "layout":
        target = state.next_layout()
        if target is None:
            state.message = "no layouts known yet"
        else:
            state.message = f"switching layout to {target}…"
            bg.start(lambda: client.switch_layout(target))
    elif action == "reload":
        state.message = "reloading…"
        bg.start(client.reload)
    return True


def run(url: str, api_key: str | None = None, interval: float = 1.0, console: Console | None = None) -> int:
    """Run until q (-> 0); Ctrl-C raises KeyboardInterrupt after the terminal is restored."""
    interval = max(interval, MIN_INTERVAL_S)
    console = console or Console()
    client = TopClient(url, api_key)
    state, bg = TopState(url=client.url), Background()
    try:
        with RawKeys() as keys, Live(console=console, screen=True, auto_refresh=False,
                                     redirect_stdout=False, redirect_stderr=False) as live:
            while True:
                state.apply(client.poll())
                if not _wait(state, client, bg, keys, live, console, time.monotonic() + interval):
                    return 0
    finally:
        client.close()


def _wait(state: TopState, client: TopClient, bg: Background, keys: RawKeys, live: Live,
          console: Console, deadline: float) -> bool:
    """Draw, then read keys until `deadline`, redrawing after each key; -> False on quit."""
    while True:
        outcome = bg.take()
        if outcome is not None:
            state.message = outcome
        live.update(render(state, console.size.width, console.size.height), refresh=True)
        left = deadline - time.monotonic()
        if left <= 0:
            return True
        for action in actions(keys.read(left)):
            if not handle(action, state, client, bg):
                return False


def once(url: str, api_key: str | None = None, interval: float = 1.0, console: Console | None = None) -> int:
    """Two polls `interval` apart (rates need two), one frame printed, no keys, no screen switch."""
    console = console or Console()
    client = TopClient(url, api_key)
    state = TopState(url=client.url)
    try:
        state.apply(client.poll())
        time.sleep(max(interval, MIN_INTERVAL_S))
        state.apply(client.poll())
    finally:
        client.close()
    console.print(render(state, console.size.width, console.size.height))
    return 0 if state.connected else 1
