"""Writing a file whole or not at all, and removing what a killed write left behind.

`atomic_write` (slot saves, the disk prompt cache) writes a hidden temporary file in the target's
folder, fsyncs it, renames it over the target and fsyncs the folder. `remove_stale_temporaries`
deletes the temporaries of writers that died (server start, before each save), never one a live
writer is still writing. Torch-free on purpose: a process that only writes files (the crash tests'
children) imports it in milliseconds.
"""

from __future__ import annotations

import logging
import os
import re
import secrets
from pathlib import Path
from typing import BinaryIO, Callable

TEMP_RE = re.compile(r"\.(.+)\.tmp-(\d+)-[0-9a-f]{8}")   # `atomic_write`'s temporaries: .<name>.tmp-<pid>-<hex>
_writing: set[Path] = set()   # temporaries that saves of this process are writing now (by resolved path)
log = logging.getLogger("slotserver.slots")


def atomic_write(path: Path, write_fn: Callable[[BinaryIO], None]) -> int:
    """Write `path` through `write_fn(file)` so that it is replaced whole or not at all; -> bytes.

    The data goes to a hidden temporary file in the same folder (same file system, so the rename
    is atomic), is flushed and fsynced, then `os.replace`d over `path`; the folder is fsynced so
    the rename itself survives a power loss. On any exception the temporary file is removed and
    `path` is untouched. A SIGKILL leaves at most a stray `.<name>.tmp-<pid>-<hex>` file, which
    `remove_stale_temporaries` deletes later; the temporary is registered in `_writing` before it
    exists and until it is gone, so that cleanup never takes it from under a live save.
    """
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}")
    key = tmp.parent.resolve() / tmp.name
    _writing.add(key)
    try:
        with open(tmp, "xb") as f:
            write_fn(f)
            f.flush()
            os.fsync(f.fileno())
            size = f.tell()
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    finally:
        _writing.discard(key)
    _fsync_dir(path.parent)
    return size


def remove_stale_temporaries(folder: Path | None) -> list[str]:
    """Delete the temporaries that killed saves left in `folder` (up to a whole slot each); -> names.

    Called at server start and before each save. Only names of `atomic_write`'s pattern are
    touched (user files cannot start with a dot, `check_name`). A temporary is stale when the pid
    in its name is this process's but no save of this process is writing it (`_writing`: e.g. an
    earlier server that had the same pid, as a container's server always has), or when that pid
    runs no process at all. A temporary of another live process (a second server sharing the
    folder) is kept; so is, until that process ends, one whose writer's pid was reused since.
    """
    if folder is None:
        return []
    root, removed = Path(folder).resolve(), []
    for entry in root.iterdir():
        match = TEMP_RE.fullmatch(entry.name)
        if match and _is_stale(entry, int(match[2])):
            try:
                entry.unlink()
            except FileNotFoundError:  # its save finished (renamed it) while we looked
                continue
            except OSError as e:  # a folder by that name, or no permission: not worth failing for
                log.warning("cannot remove stale slot temporary %s: %s", entry.name, e.strerror or e)
                continue
            removed.append(entry.name)
    return removed


def _is_stale(entry: Path, pid: int) -> bool:
    if pid == os.getpid():
        return entry not in _writing
    return not _process_exists(pid)


def _process_exists(pid: int) -> bool:
    """Whether `pid` runs a process (of any user); True where that cannot be told safely."""
    if os.name != "posix":
        return True  # Windows' os.kill(pid, 0) sends CTRL_C_EVENT instead of probing
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, OverflowError):
        return False
    except OSError:  # PermissionError: it exists, another user's
        return True
    return True


def _fsync_dir(folder: Path) -> None:
    if not hasattr(os, "O_DIRECTORY"):  # Windows cannot open a folder; its rename is durable enough
        return
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
