"""slotserver: a llama.cpp-style LLM slot server with live-reloadable KV layouts and kernels.

The command line: one sub-command per file (`cli_<name>.py`), dispatched here.

Errors the user can fix (a bad flag, a broken GGUF, a missing file) end the program with one clear
line on stderr and exit status 2, never a traceback.
"""

from __future__ import annotations

import argparse
import sys

from slotserver import __version__


def build_parser() -> argparse.ArgumentParser:
    from slotserver import cli_generate, cli_lab, cli_serve
    from slotserver import cli_bench
    from slotserver import cli_top

    parser = argparse.ArgumentParser(prog="slotserver", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"slotserver {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    cli_generate.add_parser(sub)
    cli_serve.add_parser(sub)
    cli_top.add_parser(sub)
    cli_bench.add_parser(sub)
    cli_lab.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    from slotserver.chat_template import ChatTemplateError
    from slotserver.config import ConfigError
    from slotserver.gguf_file import GGUFError
    from slotserver.module_loader import ModuleLoadError
    from slotserver.tokenizer import TokenizerError

    args = build_parser().parse_args(argv)
    try:
        return int(args.run(args) or 0)
    except (GGUFError, ConfigError, ModuleLoadError, TokenizerError, ChatTemplateError,
            FileNotFoundError) as e:
        print(f"slotserver: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
