"""llama-server's `-C/--cpu-mask M` and `-Cr/--cpu-range lo-hi`: the CPUs the server computes on.

As llama.cpp (common/common.cpp parse_cpu_mask, parse_cpu_range): the mask is hexadecimal of any
length (`0x` optional), its last digit CPUs 0-3; a range is `lo-hi`, inclusive, either end left out
for the first or last CPU; both flags together take the union. Here they set the process's
affinity before torch starts its threads, so compute threads stay on those CPUs, and the default
`-t` (the physical cores this process may use, runtime/cpu_features.py) counts only them.
CPUs this process may not use are left out; a set with none it may use is refused by name.
"""

from __future__ import annotations

import argparse
import os

from slotserver.errors import ConfigError

MAX_CPUS = 512   # llama.cpp's GGML_MAX_N_THREADS: its masks and ranges name CPUs below it


def parse_mask(text: str) -> set[int]:
    digits = text[2:] if text.lower().startswith("0x") else text
    try:
        value = int(digits, 16) if digits else -1
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a hexadecimal CPU mask such as 0xff, got {text!r}")
    if value.bit_length() > MAX_CPUS:
        raise argparse.ArgumentTypeError(f"a CPU mask names CPUs 0-{MAX_CPUS - 1} (llama.cpp's limit), got {text!r}")
    return {bit for bit in range(value.bit_length()) if value >> bit & 1}


def parse_range(text: str, n_cpus: int | None = None) -> set[int]:
    n_cpus = min(n_cpus or os.cpu_count() or 1, MAX_CPUS)
    lo, dash, hi = text.partition("-")
    try:
        first, last = int(lo) if lo else 0, int(hi) if hi else n_cpus - 1
    except ValueError:
        first = last = -1
    if not dash or first < 0 or last < first or last >= MAX_CPUS:
        raise argparse.ArgumentTypeError(f"expected a CPU range lo-hi within 0-{MAX_CPUS - 1} such as 0-3, got {text!r}")
    return set(range(first, last + 1))


class _ListDevices(argparse.Action):
    """llama-server's --list-devices: what `--device` can name here, then exit 0."""

    def __call__(self, parser, namespace, value, option_string=None) -> None:
        from slotserver.runtime import cpu_features

        cpu = cpu_features.current()
        print("Available devices:")
        print(f"  cpu: {cpu_features.physical_cores()} physical cores usable, kernels for {cpu.variant}")
        try:
            import torch
        except ImportError:
            parser.exit(0)
        for i in range(torch.cuda.device_count() if torch.cuda.is_available() else 0):
            free, total = torch.cuda.mem_get_info(i)
            print(f"  cuda:{i}: {torch.cuda.get_device_name(i)} ({total >> 20} MiB, {free >> 20} MiB free)")
        parser.exit(0)


def add_cpu_args(g) -> None:
    g.add_argument("--list-devices", action=_ListDevices, nargs=0, help="print the devices --device can use, then exit")
    g.add_argument("-C", "--cpu-mask", type=parse_mask, default=None, metavar="M",
                   help="compute only on the CPUs of this hexadecimal mask (with -Cr: their union)")
    g.add_argument("-Cr", "--cpu-range", type=parse_range, default=None, metavar="lo-hi",
                   help="compute only on these CPUs, e.g. 0-3 (with -C: their union)")


def apply_cpu_affinity(args) -> None:
    """Pin this process to -C / -Cr's CPUs (before torch is imported: its threads inherit it)."""
    cpus = (getattr(args, "cpu_mask", None) or set()) | (getattr(args, "cpu_range", None) or set())
    if not cpus:
        return
    have = os.sched_getaffinity(0)
    if not cpus & have:
        raise ConfigError(f"-C/-Cr name CPUs {_shown(cpus)}, none of which this process may use ({_shown(have)})")
    os.sched_setaffinity(0, cpus & have)


def _shown(cpus: set[int]) -> str:
    return ",".join(map(str, sorted(cpus)[:16])) + (",..." if len(cpus) > 16 else "")
