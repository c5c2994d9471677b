"""`slotserver lab check`: check the lab's kernels and layouts before (or while) serving them.

Runs `slotserver.lab.check.run_lab_check`: every kernel's cpu and Triton implementation against
its reference (Triton interpreted on CPU when there is no GPU), every Triton kernel compiled ahead
of time for sm_80 and sm_90 (registers, shared memory, spills), and every layout's contract.
Exit status 0 when every check passes, 1 otherwise.
"""

from __future__ import annotations

import argparse
from pathlib import Path


def add_parser(sub) -> None:
    lab = sub.add_parser("lab", help="the kernel and layout lab")
    lab_sub = lab.add_subparsers(dest="lab_command", required=True)
    p = lab_sub.add_parser("check", help="check kernels against their references, compile for sm_80/sm_90, check layouts")
    p.add_argument("--kernels-dir", type=Path, default=None, help="kernel modules (default: the repo's kernels/)")
    p.add_argument("--layouts-dir", type=Path, default=None, help="layout modules (default: the repo's layouts/)")
    p.add_argument("--cases", type=int, default=None, help="random inputs per kernel and dtype (default 6)")
    p.add_argument("--no-aot", action="store_true", help="skip the ahead-of-time GPU compiles")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from slotserver.lab.check import N_CASES, format_report, run_lab_check

    for folder in (args.kernels_dir, args.layouts_dir):
        if folder is not None and not folder.is_dir():
            raise FileNotFoundError(f"no such folder: {folder}")
    results = run_lab_check(args.kernels_dir, args.layouts_dir, n_cases=args.cases or N_CASES, aot=not args.no_aot)
    print(format_report(results))
    return 0 if all(r.ok for r in results) else 1
