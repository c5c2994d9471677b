"""`slotserver lab check|init|build`: check the lab's kernels and layouts, copy them out for
editing, or compile their C libraries ahead of use.

`lab init DIR` copies the bundled kernels/ and layouts/ (a checkout's own, or the copy an installed
wheel carries) into DIR/kernels and DIR/layouts; `serve --lab DIR` (or `generate --lab DIR`)
serves and watches that copy, so an installed package is a lab too.

Runs `slotserver.lab.check.run_lab_check`: every kernel's cpu and Triton implementation against
its reference (Triton interpreted on CPU when there is no GPU), every Triton kernel compiled ahead
of time for sm_80 and sm_90 (registers, shared memory, spills), and every layout's contract.
Exit status 0 when every check passes, 1 otherwise.

`lab build` compiles every C library a load would compile, on all cores (slotserver/lab/build.py);
`make setup` runs it once, so a first `make serve` or `make test` finds them cached.
"""

from __future__ import annotations

import argparse
from pathlib import Path


def add_parser(sub) -> None:
    lab = sub.add_parser("lab", help="the kernel and layout lab")
    lab_sub = lab.add_subparsers(dest="lab_command", required=True, metavar="{check,init,build}")
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
    p = lab_sub.add_parser("build", help="compile every C kernel library now, on all cores (else each compiles on first use)")
    p.add_argument("--kernels-dir", type=Path, default=None, help="kernel modules (default: the repo's kernels/)")
    p.add_argument("-j", "--jobs", type=int, default=None, help="processes compiling at once (default: the usable cores)")
    p.set_defaults(run=run_build)


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


def run_build(args: argparse.Namespace) -> int:
    """Compile (or find cached) every library; a line for each module that failed, one summary line."""
    import time

    from slotserver.errors import ConfigError
    from slotserver.lab.build import build_all, default_processes
    from slotserver.runtime import native
    from slotserver.runtime.loader import default_dir

    if not native.enabled():
        print("lab build: nothing to compile (no C compiler, or SLOTSERVER_NATIVE=0): the torch forms serve")
        return 0
    folder = args.kernels_dir or default_dir("kernels")
    if not folder.is_dir():
        raise ConfigError(f"lab build: no such folder: {folder}")
    processes = args.jobs or default_processes()
    start = time.perf_counter()
    results = build_all(folder, processes)
    for name, seconds, error in results:
        if error is not None:
            print(f"  {name}: {error}")
    took = sorted(results, key=lambda r: -r[1])[:3]
    print(f"lab build: {len(results)} modules loaded, {sum(e is not None for *_, e in results)} failed, "
          f"{time.perf_counter() - start:.1f} s on {processes} process(es) into {native.cache_dir()} "
          f"(longest: {', '.join(f'{n} {s:.1f} s' for n, s, _ in took)})")
    return 0 if all(e is None for *_, e in results) else 1


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
