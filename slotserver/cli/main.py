"""slotserver: a llama.cpp-style LLM slot server with live-reloadable KV layouts and kernels.

The command line: one sub-command per file (slotserver/cli/<name>.py), dispatched here.

Errors the user can fix (a bad flag, a broken GGUF, a missing file) end the program with one clear
line on stderr and exit status 2, never a traceback.
"""

from __future__ import annotations

import os
import sys

from slotserver import __version__
from slotserver.cli.parser import CommandParser
from slotserver.errors import USER_ERRORS


def build_parser() -> CommandParser:
    from slotserver.cli import generate as cli_generate
    from slotserver.cli import lab as cli_lab
    from slotserver.cli import serve as cli_serve
    from slotserver.cli import bench as cli_bench
    from slotserver.cli import top as cli_top
    from slotserver.cli import replica_router as cli_replica_router

    parser = CommandParser(prog="slotserver", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"slotserver {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)   # sub-parsers: CommandParser too
    cli_generate.add_parser(sub)
    cli_serve.add_parser(sub)
    cli_top.add_parser(sub)
    cli_bench.add_parser(sub)
    cli_lab.add_parser(sub)
    cli_replica_router.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    # numpy's OpenBLAS starts a thread per core at import, and they spin ~0.1 s of CPU on the cores
    # torch's OpenMP team loads and computes on (measured: 0.16 vs 0.05 s of CPU for `import numpy`);
    # nothing here uses numpy's BLAS. Set before any sub-command imports numpy; a user's value wins.
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    args = build_parser().parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)   # --tp: the command line its other ranks run
    try:
        return int(args.run(args) or 0)
    except KeyboardInterrupt:
        print("", file=sys.stderr)
        return 130
    except USER_ERRORS as e:   # slotserver.errors imports no torch: light commands stay light
        if "SLOTSERVER_TP_PARENT" not in os.environ:   # a rank --tp spawned: rank 0 says the same line
            print(f"slotserver: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
