"""Single key presses from the terminal, without echo, and the terminal given back afterwards.

`RawKeys` puts stdin in cbreak mode (no line buffering, no echo) for the duration of a `with`
block and restores the saved termios settings in `__exit__`, which runs on a normal exit, on an
exception and on Ctrl-C alike. cbreak (not raw) keeps ISIG on, so Ctrl-C still raises
KeyboardInterrupt instead of arriving as a key. Stdin that is not a terminal (a pipe, /dev/null)
is read as is; at its end no more keys come, and the monitor runs until interrupted.
"""

from __future__ import annotations

import os
import select
import sys
import time
from typing import TextIO

KEYMAP = {"q": "quit", "Q": "quit", "l": "layout", "L": "layout", "r": "reload", "R": "reload"}


def actions(text: str) -> list[str]:
    """Key presses -> action names, unknown keys ignored, in order."""
    return [KEYMAP[ch] for ch in text if ch in KEYMAP]


class RawKeys:
    def __init__(self, stream: TextIO | None = None) -> None:
        self.stream = stream if stream is not None else sys.stdin
        self.fd: int | None = None
        self.saved: list | None = None
        self.closed = False

    def __enter__(self) -> "RawKeys":
        try:
            self.fd = self.stream.fileno()
        except (AttributeError, OSError, ValueError):
            self.fd, self.closed = None, True      # no file descriptor: no keys
            return self
        if os.isatty(self.fd):
            import termios
            import tty

            self.saved = termios.tcgetattr(self.fd)
            tty.setcbreak(self.fd, termios.TCSANOW)
        return self

    def __exit__(self, *exc) -> None:
        self.restore()

    def restore(self) -> None:
        if self.saved is not None and self.fd is not None:
            import termios

            termios.tcsetattr(self.fd, termios.TCSADRAIN, self.saved)
            self.saved = None

    def read(self, timeout: float) -> str:
        """The keys typed within `timeout` seconds ("" if none); returns as soon as one comes."""
        if self.closed or self.fd is None:
            time.sleep(max(timeout, 0.0))
            return ""
        ready, _, _ = select.select([self.fd], [], [], max(timeout, 0.0))
        if not ready:
            return ""
        data = os.read(self.fd, 64)
        if not data:                               # end of a pipe: stop selecting on it
            self.closed = True
        return data.decode("utf-8", errors="ignore")
