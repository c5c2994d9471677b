"""llama-server flags about its own machinery (offload, mmap, NUMA, HTTP threads, log styling): taken,
so that a llama-server command line starts here unchanged, and named at start-up with why each has
no effect, so none is silently dropped.

`-ngl 0` keeps its meaning: the model stays on the CPU (as `--device cpu`, unless --device is
given; server/config_from_args.py); any other -ngl puts the whole model where --device says (no
partial offload here).
`--log-file FILE` and `--log-disable` act (log_setup). `-nocb` (continuous batching off) is
refused: the engine has no other mode.
"""

from __future__ import annotations

import argparse
import logging
import sys

from slotserver.errors import ConfigError

# (flags, argparse nargs: 0 a switch, None one value, "?" an optional one; why it has no effect here)
NO_EFFECT: tuple[tuple[tuple[str, ...], int | str | None, str], ...] = (
    (("--mlock",), 0, "the GGUF is read once at load into the served (repacked) weights; nothing mapped to lock"),
    (("--mmap", "--no-mmap"), 0, "the GGUF is read once at load into the served (repacked) weights"),
    (("-cb", "--cont-batching"), 0, "continuous batching is always on"),
    (("--numa",), None, "threads are placed by the OS"),
    (("--threads-http",), None, "HTTP is served by one asyncio event loop"),
    (("-tb", "--threads-batch"), None, "prompts run on -t threads, as decode steps"),
    (("-sm", "--split-mode"), None, "one device per process (--tp splits a model across processes)"),
    (("-ts", "--tensor-split"), None, "one device per process (--tp splits a model across processes)"),
    (("-mg", "--main-gpu"), None, "the first CUDA device is used"),
    (("-kvo", "--kv-offload", "-nkvo", "--no-kv-offload"), 0, "the KV cache lives with the weights"),
    (("-cmoe", "--cpu-moe"), 0, "all of a model's weights, experts included, are on --device"),
    (("-ncmoe", "--n-cpu-moe"), None, "all of a model's weights, experts included, are on --device"),
    (("-ncffn", "--n-cpu-ffn"), None, "all of a model's weights are on --device"),
    (("-ot", "--override-tensor"), None, "all of a model's weights are on --device"),
    (("-bs", "--backend-sampling"), 0, "on CUDA the sampler chain runs on the device already (where measured faster)"),
    (("--swa-full",), 0, "sliding-window layers keep every cell here: the window is a mask"),
    (("--no-host",), 0, "no host buffer types here"),
    (("--repack", "-nr", "--no-repack"), 0, "GGUF blocks are always repacked for the CPU at load"),
    (("-fit", "--fit"), None, "-c is taken as given, not fitted to free memory"),
    (("--perf", "--no-perf"), 0, "timings are always measured"),
    (("--offline",), 0, "nothing is ever downloaded"),
    (("--log-prefix", "--no-log-prefix"), 0, "log lines have one format here"),
    (("--log-timestamps", "--no-log-timestamps"), 0, "log lines have one format here"),
    (("--log-colors",), "?", "log lines are not coloured"),
    (("-lv", "--verbosity", "--log-verbosity"), None, "-v turns debug lines on"),
)


class _NoEffect(argparse.Action):
    def __init__(self, option_strings, dest, why: str, **kw) -> None:
        self.why = why
        super().__init__(option_strings, dest, **kw)

    def __call__(self, parser, namespace, value, option_string=None) -> None:
        shown = f"{option_string} {value}" if isinstance(value, str) else option_string
        namespace.no_effect = [*(getattr(namespace, "no_effect", None) or []), f"{shown} ({self.why})"]


class _Refused(argparse.Action):
    @property
    def refusal(self) -> str:   # read by cli/llama_env.py, so a variable's error names the variable
        return self.help

    def __call__(self, parser, namespace, value, option_string=None) -> None:
        parser.error(f"{option_string}: {self.help}")


def add_compat_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("llama-server flags with no effect here (named at start-up)")
    for flags, nargs, why in NO_EFFECT:
        g.add_argument(*flags, dest="no_effect", action=_NoEffect, why=why, nargs=nargs, metavar="V", help=why)
    g.add_argument("-ngl", "--gpu-layers", "--n-gpu-layers", dest="n_gpu_layers", default=None, metavar="N",
                   help="0: the model stays on the CPU (as --device cpu); otherwise all of it goes to --device")
    g.add_argument("-nocb", "--no-cont-batching", action=_Refused, nargs=0,
                   help="continuous batching cannot be turned off here")
    g.add_argument("--log-file", default=None, metavar="FILE", help="also write the log to FILE")
    g.add_argument("--log-disable", action="store_true", help="no log lines")
    p.set_defaults(no_effect=None)


def log_setup(args: argparse.Namespace, fmt: str) -> None:
    """The serve process's logging: stderr (unless --log-disable), and --log-file; then the flags
    that have no effect, one line."""
    handlers: list[logging.Handler] = [] if args.log_disable else [logging.StreamHandler(sys.stderr)]
    if args.log_file:
        try:
            handlers.append(logging.FileHandler(args.log_file, encoding="utf-8"))
        except OSError as e:
            raise ConfigError(f"--log-file {args.log_file}: {e.strerror}") from None
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO, format=fmt, datefmt="%H:%M:%S",
                        handlers=handlers or [logging.NullHandler()])
    if getattr(args, "llama_env", ""):
        logging.getLogger("slotserver").info("from llama-server's environment variables: %s", args.llama_env)
    if args.no_effect:
        logging.getLogger("slotserver").info("llama-server flags with no effect here: %s", "; ".join(args.no_effect))
