"""`slotserver lab check|init`: check the lab's kernels and layouts, or copy them out for editing.

`lab init DIR` copies the bundled kernels/ and layouts/ (a checkout's own, or the copy an installed
wheel carries) into DIR/kernels and DIR/layouts; `serve --lab DIR` (or `generate --lab DIR`)
serves and watches that copy, so an installed package is a lab too.

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
    lab_sub = lab.add_subparsers(dest="lab_command", required=True, metavar="{check,init}")
    p = lab_sub.add_parser("check", help="check kernels against their references, compile for sm_80/sm_90, check layouts")
    p.add_argument("--kernels-dir", type=Path, default=None, help="kernel modules (default: the repo's kernels/)")
    p.add_argument("--layouts-dir", type=Path, default=None, help="layout modules (default: the repo's layouts/)")
    p.add_argument("--cases", type=int, default=None, help="random inputs per kernel and dtype (default 6)")
    p.add_argument("--no-aot", action="store_true", help="skip the ahead-of-time GPU compiles")
    p.add_argument("--time", action="store_true",
                   help="also time each kernel on serving sizes (Triton on a GPU, else the cpu implementations) "
                        "against the copy bandwidth and matmul rate measured here")
    p.set_defaults(run=run)
    p = lab_sub.add_parser("init", help="copy the bundled kernels and layouts into DIR for editing")
    p.add_argument("dir", type=Path)
    p.add_argument("--force", action="store_true", help="overwrite files that are already there")
    p.set_defaults(run=run_init)


def add_lab_arg(p) -> None:
    p.add_argument("--lab", type=Path, default=None, metavar="DIR",
                   help="serve DIR/kernels and DIR/layouts (made by `slotserver lab init DIR`)")


def apply_lab_dir(args: argparse.Namespace) -> None:
    """`--lab DIR` -> args.kernels_dir / args.layouts_dir; ConfigError (one line, exit 2) if odd."""
    from slotserver.errors import ConfigError

    if getattr(args, "lab", None) is None:
        return
    if args.kernels_dir is not None or args.layouts_dir is not None:
        raise ConfigError("--lab DIR replaces --kernels-dir and --layouts-dir: give one or the others")
    for kind in ("kernels", "layouts"):
        if not (args.lab / kind).is_dir():
            raise ConfigError(f"--lab {args.lab}: no {kind}/ folder there (make one with `slotserver lab init {args.lab}`)")
    args.kernels_dir, args.layouts_dir = args.lab / "kernels", args.lab / "layouts"


def run_init(args: argparse.Namespace) -> int:
    from slotserver.errors import ConfigError
    from slotserver.runtime.loader import default_dir, lab_files

    # the modules and the C files they compile (kernels/attention.c)
    plan = [(src, args.dir / kind / src.name) for kind in ("kernels", "layouts") for src in lab_files(default_dir(kind))]
    existing = [str(dst) for _, dst in plan if dst.exists()]
    if existing and not args.force:
        raise ConfigError(f"lab init: {len(existing)} file(s) already there (first: {existing[0]}); --force overwrites")
    for src, dst in plan:
        dst.parent.mkdir(parents=True, exist_ok=True)
        dst.write_bytes(src.read_bytes())
    print(f"copied {len(plan)} files into {args.dir}; serve them with: slotserver serve --lab {args.dir}")
    return 0


def run(args: argparse.Namespace) -> int:
    from slotserver.lab.check import N_CASES, format_report, run_lab_check

    for folder in (args.kernels_dir, args.layouts_dir):
        if folder is not None and not folder.is_dir():
            raise FileNotFoundError(f"no such folder: {folder}")
    results = run_lab_check(args.kernels_dir, args.layouts_dir, n_cases=args.cases or N_CASES, aot=not args.no_aot)
    print(format_report(results))
    if args.time:
        print()
        print(time_kernels(args.kernels_dir))
    return 0 if all(r.ok for r in results) else 1


def time_kernels(kernels_dir: Path | None, small: bool = False) -> str:
    """`--time`: every kernel's serving implementation on this machine (slotserver/lab/timing.py)."""
    import torch

    from slotserver.lab.check import kernel_files
    from slotserver.lab.timing import default_timer, format_timings, measure_limits, time_kernel
    from slotserver.runtime.loader import default_dir

    device = "cuda" if torch.cuda.is_available() else "cpu"
    impl = "triton" if device == "cuda" else "cpu"
    timer = default_timer(device)
    rows = [t for p in kernel_files(Path(kernels_dir or default_dir("kernels")))
            for t in time_kernel(p, impl, device, timer, small)]
    return f"timings of the {impl} implementations on {device}:\n" + format_timings(rows, measure_limits(device, timer, small))
