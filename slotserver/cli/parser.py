"""The argument parser every command and sub-command uses, so they all refuse a bad flag alike.

argparse hands a sub-command's unknown flags back to the top-level parser, which then prints the
top-level usage (`slotserver generate --foo` showed `usage: slotserver {generate,serve,...}`, the
wrong help). Here each parser refuses what it does not know itself, in one line on stderr that
names the command and points to its own `--help`, with exit status 2.
"""

from __future__ import annotations

import argparse


class CommandParser(argparse.ArgumentParser):
    """One-line errors naming this (sub-)command's own --help; unknown flags refused here."""

    def parse_known_args(self, args=None, namespace=None):
        ns, extras = super().parse_known_args(args, namespace)
        if extras:
            self.error(f"unrecognized arguments: {' '.join(extras)}")
        return ns, extras

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")
