"""One model download in a process of its own, for the router's POST /models (router/downloads.py).

    python -m slotserver.hub.download_child USER/REPO FILE CACHE_DIR     (the token: HF_TOKEN)

Why a process: huggingface_hub's download cannot be interrupted from another thread, and DELETE
/models (or stopping the router) must stop a multi-GB download at once, as llama-server's router
stops its download child. Terminating this process does: the partial file stays in the cache's
blobs as `.incomplete`, which huggingface_hub resumes the next time the model is asked for.

It writes JSON lines on stdout: `{"file", "done", "total"}` as bytes arrive (download.py's
progress, at most every PROGRESS_S seconds, and at each file's end), then `{"path": ...}` and exit
0, or `{"error": "<one line>"}` and exit 1.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from slotserver.errors import ConfigError
from slotserver.hub.download import download


def _say(**fields) -> None:
    sys.stdout.write(json.dumps(fields) + "\n")
    sys.stdout.flush()


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        _say(error="usage: python -m slotserver.hub.download_child USER/REPO FILE CACHE_DIR")
        return 2
    repo, name, where = argv
    try:
        path = download(repo, name, os.environ.get("HF_TOKEN") or None, Path(where),
                        lambda file, done, total: _say(file=file, done=done, total=total))
    except ConfigError as e:
        _say(error=str(e))
        return 1
    _say(path=str(path))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
