"""`slotserver top`: a live terminal monitor of a running server (slots, KV streams, lab).

Keys: q quits, l switches the server to the next KV layout, r asks the lab to reload changed
kernel and layout files. The monitor only speaks HTTP (`/health`, `/lab`, `/props`), so it runs
anywhere the server's port is reachable, and it keeps running while the server restarts.
"""

from __future__ import annotations

import argparse
import os


def _interval(raw: str) -> float:
    try:
        value = float(raw)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {raw!r}") from None
    if not 0 < value <= 3600:
        raise argparse.ArgumentTypeError(f"must be in (0, 3600] seconds, got {raw}")
    return value


def add_parser(sub) -> None:
    p = sub.add_parser("top", help="live terminal monitor of a running server (q quits)",
                       description=__doc__.splitlines()[0])
    p.add_argument("--url", default="http://127.0.0.1:8080", help="the server (default http://127.0.0.1:8080)")
    p.add_argument("--api-key", default=None,
                   help="sent as 'Authorization: Bearer KEY' (default: $SLOTSERVER_API_KEY, if set)")
    p.add_argument("--interval", type=_interval, default=1.0, metavar="S", help="seconds between polls (default 1)")
    p.add_argument("--once", action="store_true", help="print one frame (after two polls) and exit")
    p.set_defaults(run=run)


def run(args) -> int:
    from slotserver.top import app

    key = args.api_key or os.environ.get("SLOTSERVER_API_KEY") or None
    if args.once:
        return app.once(args.url, key, args.interval)
    return app.run(args.url, key, args.interval)
