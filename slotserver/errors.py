"""The errors a user can fix, in one place that imports nothing heavy.

Each is raised deep inside a subpackage (the GGUF reader, the tokenizer, a config dataclass) and
caught far away: the command line turns `USER_ERRORS` into one line on stderr and exit status 2,
the server turns them into HTTP 400/503. Defining them here, with only the standard library, lets
any catcher name them without importing torch or the engine. Their old modules re-export them,
so `from slotserver.model.gguf_file import GGUFError` keeps working.

Errors that belong to one side only stay there: the HTTP `ApiError` (server/errors.py), `SlotBusy`
(engine/port.py), and bench's own `ConfigError`/`BenchError` (bench imports nothing of slotserver).
"""

from __future__ import annotations

import os


class ConfigError(ValueError):
    """A bad setting; the message names it."""


class RequestError(ValueError):
    """The request cannot be served as given (HTTP 400)."""


class EngineBusy(RuntimeError):
    """The wait queue is full (HTTP 503)."""


class SamplingError(ValueError):
    """A sampling parameter or sampler input is invalid; the message names the culprit."""


class GGUFError(Exception):
    """A GGUF file is missing, unreadable, malformed or lacks what the caller needs.

    `str(e)` is a single line "<path>: <problem>"; `GGUFError(message)` alone is also accepted.
    """

    def __init__(self, path: str | os.PathLike, problem: str | None = None) -> None:
        self.path = None if problem is None else str(path)
        self.problem = str(path) if problem is None else problem
        text = self.problem if self.path is None else f"{self.path}: {self.problem}"
        super().__init__(" ".join(text.splitlines()))  # one line, whatever names contain


class TokenizerError(Exception):
    """The metadata describes a tokenizer we cannot reproduce, or the input is invalid."""


class ChatTemplateError(Exception):
    """The template or the messages cannot produce a prompt."""


class ModuleLoadError(Exception):
    """A kernel or layout file that cannot be used; the message names the file and the reason."""


def line_of(exc: BaseException, path: object) -> int | str:
    """The line of file `path` where `exc` was raised (its innermost frame there), or '?': how a
    ModuleLoadError names the line of a kernel or layout file (or a kernel's part) that failed."""
    tb, line = exc.__traceback__, "?"
    while tb is not None:
        if os.path.abspath(tb.tb_frame.f_code.co_filename) == os.path.abspath(str(path)):
            line = tb.tb_lineno
        tb = tb.tb_next
    return line


# What the command line reports as "slotserver: error: <message>" (exit 2) instead of a traceback.
USER_ERRORS: tuple[type[BaseException], ...] = (GGUFError, ConfigError, ModuleLoadError, TokenizerError,
                                                ChatTemplateError, FileNotFoundError)
