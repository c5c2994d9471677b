"""llama-server flags about its own machinery (offload, mmap, NUMA, HTTP threads, log styling): taken,
so that a llama-server command line starts here unchanged, and named at start-up with why each has
no effect, so none is silently dropped.

`-ngl 0` keeps its meaning: the model stays on the CPU (as `--device cpu`, unless --device is
given; server/config_from_args.py); any other -ngl puts the whole model where --device says (no
partial offload here).
`--log-file FILE` and `--log-disable` act (log_setup), and so do `-C/-Cr` (placement_args.py).
`-nocb` (continuous batching off) is refused: the engine has no other mode; so are the flags of
features this server does not have (`REFUSED`: downloads, multimodal, RPC, built-in tools...),
each with its reason, where argparse would only say "unrecognized arguments".
"""

from __future__ import annotations

import argparse
import logging
import sys

from slotserver.cli.placement_args import add_cpu_args
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
    (("--log-prefix", "--no-log-prefix"), 0, "log lines have one format here"),
    (("--log-timestamps", "--no-log-timestamps"), 0, "log lines have one format here"),
    (("--log-colors",), "?", "log lines are not coloured"),
    (("-lv", "--verbosity", "--log-verbosity"), None, "-v turns debug lines on"),
    (("--log-jsonl", "--no-log-jsonl"), 0, "log lines have one format here"),
    (("-Cb", "--cpu-mask-batch"), None, "prompts run on the same threads as decode steps (-C/-Cr)"),
    (("-Crb", "--cpu-range-batch"), None, "prompts run on the same threads as decode steps (-C/-Cr)"),
    (("--cpu-strict", "--cpu-strict-batch"), None, "threads are placed by the OS within -C/-Cr's CPUs"),
    (("--prio", "--prio-batch"), None, "threads run at the process's priority (start it under nice to change it)"),
    (("--poll", "--poll-batch"), None, "compute threads wait for work as torch's OpenMP runtime makes them"),
    (("-dt", "--defrag-thold"), None, "KV defragmentation runs whenever slots free cells (--defrag on|off)"),
    (("--op-offload", "--no-op-offload"), 0, "all of a model's operations run on --device"),
    (("-lm", "--load-mode"), None, "the GGUF is read once at load into the served (repacked) weights"),
    (("-lzm", "--lazy-mode"), None, "the GGUF is read once at load into the served (repacked) weights"),
    (("-fitt", "--fit-target"), None, "-c is taken as given, not fitted to free memory"),
    (("-fitc", "--fit-ctx"), None, "-c is taken as given, not fitted to free memory"),
    (("-cms", "--checkpoint-min-step"), None, "a hybrid model's checkpoints sit 4 tokens before each prompt's end"),
    (("-lcs", "--lookup-cache-static"), None, "n-gram drafts come from each slot's own tokens"),
    (("-lcd", "--lookup-cache-dynamic"), None, "n-gram drafts come from each slot's own tokens"),
    (("-p", "--prompt"), None, "llama-cli's prompt: the server takes prompts per request"),
    (("-f", "--file"), None, "llama-cli's prompt file: the server takes prompts per request"),
    (("-bf", "--binary-file"), None, "llama-cli's prompt file: the server takes prompts per request"),
    (("-e", "--escape", "--no-escape"), 0, "llama-cli's escapes: requests are JSON"),
    (("--mmproj-auto", "--no-mmproj", "--no-mmproj-auto"), 0, "no multimodal projector is loaded here"),
    (("--mmproj-offload", "--no-mmproj-offload"), 0, "no multimodal projector is loaded here"),
    (("-no-ag", "--no-agent", "--no-ui-mcp-proxy", "--no-webui-mcp-proxy"), 0, "no built-in tools or MCP here"),
    (("--spec-draft-threads", "-td", "--threads-draft", "--spec-draft-threads-batch", "-tbd",
      "--threads-batch-draft"), None, "a draft model runs on the server's -t threads"),
    (("--spec-draft-cpu-mask", "-Cd", "--cpu-mask-draft", "--spec-draft-cpu-range", "-Crd", "--cpu-range-draft",
      "--spec-draft-cpu-mask-batch", "-Cbd", "--cpu-mask-batch-draft", "--spec-draft-cpu-range-batch", "-Crbd",
      "--cpu-range-batch-draft", "--spec-draft-cpu-strict",
      "--cpu-strict-draft", "--spec-draft-cpu-strict-batch", "--cpu-strict-batch-draft", "--spec-draft-prio",
      "--prio-draft", "--spec-draft-prio-batch", "--prio-batch-draft", "--spec-draft-poll", "--poll-draft",
      "--spec-draft-poll-batch", "--poll-batch-draft"), None, "a draft model runs on the server's threads and CPUs"),
    (("--spec-draft-device", "-devd", "--device-draft", "--spec-draft-ngl", "-ngld", "--gpu-layers-draft",
      "--n-gpu-layers-draft"), None, "a draft model runs where --device says, as the model"),
    (("--spec-draft-override-tensor", "-otd", "--override-tensor-draft", "--spec-draft-n-cpu-moe",
      "--spec-draft-ncmoe", "-ncmoed", "--n-cpu-moe-draft"), None, "all of a draft model's weights are on --device"),
    (("--spec-draft-cpu-moe", "-cmoed", "--cpu-moe-draft"), 0, "all of a draft model's weights are on --device"),
    (("--spec-draft-backend-sampling", "--no-spec-draft-backend-sampling"), 0,
     "drafts are sampled where the model runs"),
    (("--spec-draft-type-k", "-ctkd", "--cache-type-k-draft", "--spec-draft-type-v", "-ctvd", "--cache-type-v-draft"),
     None, "a draft model's KV cache takes -ctk/-ctv's element type"),
    (("--spec-draft-p-split", "--draft-p-split"), None, "drafts are single sequences (llama.cpp reads it nowhere either)"),
    (("--spec-ngram-simple-min-hits",), None, "ngram-simple drafts from the first match (llama.cpp's reads it nowhere either)"),
    (("--spec-ngram-map-k-size-n", "--spec-ngram-map-k-size-m", "--spec-ngram-map-k-min-hits",
      "--spec-ngram-map-k4v-size-n", "--spec-ngram-map-k4v-size-m", "--spec-ngram-map-k4v-min-hits"), None,
     "the ngram-map-k/k4v speculative types are not implemented here (--spec-type names the ones that are)"),
)

DOWNLOADS = "only -hf USER/MODEL[:QUANT] downloads here (or download the GGUF and pass -m FILE)"
# (flags, nargs, why start-up stops): features this server does not have, refused by name rather
# than left as "unrecognized arguments"
REFUSED: tuple[tuple[tuple[str, ...], int | str | None, str], ...] = (
    (("-mu", "--model-url", "-dr", "--docker-repo"), None, DOWNLOADS),
    (("--embd-gemma-default", "--fim-qwen-1.5b-default", "--fim-qwen-3b-default",
      "--fim-qwen-7b-default", "--fim-qwen-7b-spec", "--fim-qwen-14b-spec", "--fim-qwen-30b-default",
      "--gpt-oss-20b-default", "--gpt-oss-120b-default", "--vision-gemma-4b-default", "--vision-gemma-12b-default"),
     0, DOWNLOADS),
    (("--rpc",), None, "no RPC backends here (--tp splits a model across processes: docs/scaling.md)"),
    (("-mm", "--mmproj", "-mmu", "--mmproj-url", "-mmdev", "--mmproj-device", "--image-min-tokens",
      "--image-max-tokens", "--mtmd-batch-max-tokens", "--video-fps", "--video-timestamp-interval",
      "--video-ffmpeg-dir", "--media-path"), None, "multimodal (image, audio, video) input is not supported here"),
    (("--tools", "--tools-runtime", "--mcp-servers-config", "--mcp-servers-json"), None,
     "no built-in tools or MCP servers here: clients run their own tools (the tool-call API works as usual)"),
    (("-ag", "--agent"), 0,
     "no built-in tools or MCP servers here: clients run their own tools (the tool-call API works as usual)"),
    (("--ui-mcp-proxy", "--webui-mcp-proxy"), 0, "no MCP proxy here: the web page calls no MCP servers"),
    (("--kv-unified-per-slot",), None, "no per-slot cap of a unified cache here: -kvu with -c sizes the pool"),
    (("--log-prompts-dir",), None, "prompts are not written to files here"),
    (("--completion-bash",), 0, "no shell completion script here"),
    (("--spec-ngram-size-n", "--spec-ngram-size-m", "--spec-ngram-min-hits"), None,
     "removed from llama.cpp too: use the respective --spec-ngram-*-size-n / -size-m, or --spec-ngram-mod-n-match"),
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
    for flags, nargs, why in REFUSED:
        g.add_argument(*flags, action=_Refused, nargs=nargs, metavar="V", help=why)
    add_cpu_args(g)
    g.add_argument("--log-file", default=None, metavar="FILE", help="also write the log to FILE")
    g.add_argument("--log-disable", action="store_true", help="no log lines")
    g.add_argument("--usage", action="help", help="llama-server's spelling of --help")
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
