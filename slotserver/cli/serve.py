"""`slotserver serve`: the HTTP server, with llama-server's flag names.

Flags are spelled as in llama-server (`-c/--ctx-size`, `-np/--parallel`, `--api-key`...), and `_`
in a long flag name counts as `-` (`--ctx_size 2048` works), as llama-server users type both.
A bad or unknown flag is one line on stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import gc
import os
import logging
import re
import sys
from dataclasses import replace
from pathlib import Path

from slotserver import __version__
from slotserver.cli.access_args import add_access_args
from slotserver.cli.compat_args import add_compat_args, log_setup
from slotserver.cli.placement_args import apply_cpu_affinity
from slotserver.cli.llama_env import env_argv, shown
from slotserver.cli.sampling_args import add_sampling_args
from slotserver.cli.spec_args import add_spec_args
from slotserver.engine.config import EngineConfig
from slotserver.cli.generate import add_model_args, start_tp
from slotserver.cli.hub_args import fetch_hub_models
from slotserver.cli.parser import CommandParser
from slotserver.cli.router_args import add_router_args, is_router, router_config

LOG_FORMAT = "%(asctime)s %(message)s"
SHORT_FLAG = re.compile(r"^-[A-Za-z]")   # a single-dash flag (not a negative number like -1)


class ServeArgumentParser(CommandParser):
    """Normalises `--long_name` to `--long-name`; errors are one line, exit status 2 (CommandParser).

    Single-dash flags must match exactly, as in llama-server: argparse would otherwise read
    llama-server's `-ngl 99` as `-n gl` and complain about an integer instead of the flag.
    llama-server's environment variables come first (cli/llama_env.py), so the command line wins.
    """

    def parse_known_args(self, args=None, namespace=None):
        args = normalize_argv(sys.argv[1:] if args is None else list(args))
        try:   # llama-server's LLAMA_ARG_* variables, under the command line's own flags
            from_env, used = env_argv(self._option_string_actions, args, os.environ)
        except argparse.ArgumentTypeError as e:
            self.error(str(e))
        unknown = [a for a in from_env + args if SHORT_FLAG.match(a) and a not in self._option_string_actions]
        if unknown:
            self.error(f"unrecognized arguments: {' '.join(unknown)}")
        parsed, rest = super().parse_known_args(from_env + args, namespace)
        # router mode passes the user's flags on to each model's server, those of variables under a
        # preset's options, the command line's over them (router/child_args.py)
        parsed.serve_argv, parsed.env_argv = args, from_env
        parsed.llama_env = shown(os.environ, used)   # named at start-up (compat_args.log_setup)
        return parsed, rest


def normalize_argv(argv: list[str]) -> list[str]:
    """`--some_flag[=v]` -> `--some-flag[=v]`; values and single-dash flags are left alone."""
    out = []
    for arg in argv:
        if arg.startswith("--") and len(arg) > 2:
            name, eq, value = arg.partition("=")
            arg = name.replace("_", "-") + eq + value
        out.append(arg)
    return out


def _switch(p: argparse.ArgumentParser, name: str, default: bool, help: str, *also: str) -> None:
    """--NAME / --no-NAME (and the same for each spelling in `also`)."""
    p.add_argument(f"--{name}", *also, dest=name.replace("-", "_"), action=argparse.BooleanOptionalAction,
                   default=default, help=help)


def add_parser(sub) -> None:
    p = sub.add_parser("serve", help="run the HTTP server (llama-server and OpenAI compatible)",
                       description=__doc__.splitlines()[0], allow_abbrev=False)
    p.__class__ = ServeArgumentParser  # argparse builds subparsers itself; this keeps its instance
    add_model_args(p)
    a = p.add_argument
    a("--version", action="version", version=f"slotserver {__version__}")
    a("--host", default="127.0.0.1")
    a("--port", type=int, default=8080)
    a("-c", "--ctx-size", type=int, default=4096,
      help="KV cells shared by all slots (default 4096; 0: the model's training context, as llama-server)")
    a("-np", "--parallel", type=int, default=4, help="number of slots (default 4)")
    a("-b", "--batch-size", type=int, default=2048)
    a("-ub", "--ubatch-size", type=int, default=512)
    a("-n", "--n-predict", "--predict", type=int, default=-1, help="default tokens to predict (-1: no limit)")
    a("--temp", "--temperature", type=float, default=0.8, help="default temperature")
    a("-s", "--seed", type=int, default=-1, help="default seed (-1: random)")
    a("--slot-save-path", type=Path, default=None, help="folder for slot save/restore")
    a("--metrics", action="store_true", help="enable GET /metrics")
    a("--lora-init-without-apply", action="store_true",
      help="load the LoRA adapters at scale 0 (POST /lora-adapters or a request's `lora` applies them)")
    _switch(p, "slots", True, "GET /slots (default on)")
    _switch(p, "webui", True, "the web page at / (chat and monitor; default on; --ui: llama-server's newer name)",
            "--ui")
    _switch(p, "jinja", True, "chat templates are always rendered with the Jinja sandbox")
    a("--chat-template", default=None, help="a Jinja template or a known name (chatml, llama3)")
    a("--chat-template-file", type=Path, default=None)
    a("--chat-template-kwargs", default=None, metavar="JSON",
      help="a JSON object of chat template variables, under each request's chat_template_kwargs")
    a("--reasoning-format", default="auto", metavar="FORMAT",
      help="none | deepseek | deepseek-legacy | auto (default): where <think> text goes in chat answers")
    a("-rea", "--reasoning", default="auto", metavar="on|off|auto", help="thinking on or off (enable_thinking)")
    a("--reasoning-effort", default="default", metavar="LEVEL",
      help="reasoning_effort given to the chat template (low, medium, high...; default: the template's own)")
    _switch(p, "reasoning-preserve", True, "past turns' reasoning kept in the prompt (the template variables "
            "preserve_reasoning, preserve_thinking, clear_thinking...; default on, as llama-server)")
    _switch(p, "prefill-assistant", True, "a final assistant message is the start of the answer, continued (default "
            "on); off: it is a whole message")
    a("-sp", "--special", action="store_true",
      help="control tokens' text in answers and their probabilities (<|im_end|> ends a ChatML answer; "
           "default: as text, '')")
    _switch(p, "skip-chat-parsing", False, "chat answers all content: reasoning and tool calls left unparsed")
    a("--reasoning-budget", type=int, default=-1, metavar="N",
      help="tokens of thinking (<think> block) before its end is forced: -1 unlimited (default), 0 at once")
    a("--sse-ping-interval", type=int, default=30, metavar="N",
      help="streamed answers: seconds of silence before an SSE ping ':' line, as llama-server (-1: none; default: 30)")
    a("--reasoning-budget-message", default="", metavar="MESSAGE",
      help="text forced before the end-of-thinking tag when the budget runs out (default: none)")
    a("--tool-call-format", default="auto", metavar="FORMAT",
      help="auto (default: the chat template's own; Hermes <tool_call> blocks for templates without tool "
           "support) | hermes | generic (llama.cpp's JSON answers): how tool calls are asked for and parsed")
    a("-a", "--alias", action="append", default=[], help="the model's names, comma-separated or repeated: the "
      "first (sorted, as llama-server) is the id clients see, each retrieves it (default: the GGUF file's name)")
    a("--tags", action="append", default=[], help="informational tags, comma-separated or repeated, listed in /v1/models")
    _switch(p, "context-shift", False, "a full slot drops tokens after n_keep and goes on generating, the KV "
            "moved and K re-rotated (default off, as llama-server)")
    a("--cache-reuse", type=int, default=0, metavar="N",
      help="reuse cached chunks of at least N tokens past the common prefix by KV shifting, as llama-server "
           "(needs --cache-prompt; default 0: off)")
    a("-ctxcp", "--ctx-checkpoints", "--swa-checkpoints", type=int, default=EngineConfig.ctx_checkpoints,
      metavar="N",
      help="a hybrid model (Qwen3.5, LFM2): copies of a slot's recurrent state kept, one 4 tokens before each "
           "prompt's end, so a prompt sharing all but the end of an earlier one resumes there (default 8; "
           "llama-server's 32; 0: none)")
    _switch(p, "cache-prompt", True, "reuse slot caches across requests (default on)")
    add_spec_args(p)
    a("-cram", "--cache-ram", type=int, default=8192, metavar="MiB",
      help="host-memory prompt cache shared by all slots: a slot's KV is kept there when another prompt "
           "takes the slot, and a request restores its longest cached prefix into any slot "
           "(default 8192, as llama-server; 0: off; -1: no limit)")
    a("--cache-disk", type=Path, default=None, metavar="DIR",
      help="prompt-cache entries also on disk under DIR (per model file and KV type), so a restart "
           "keeps them: written when KV leaves a slot and at shutdown, read back by longest prefix")
    a("--cache-disk-mib", type=int, default=10240, metavar="MiB",
      help="--cache-disk's size cap for this model, least recently used out first (default 10240; -1: no limit)")
    _switch(p, "cache-idle-slots", True, "with --cache-ram: save idle slots to it when a request starts "
            "(and clear them with --kv-unified); default on")
    a("-v", "--verbose", "--log-verbose", action="store_true", help="debug log lines (the prompt cache's among them)")
    a("-sps", "--slot-prompt-similarity", type=float, default=0.1)
    a("-to", "--timeout", type=float, default=600.0, help="read/write timeout in seconds")
    a("--defrag", choices=["on", "off"], default="on")
    a("--async-steps", choices=["auto", "on", "off"], default="auto",
      help="overlapped decode steps: the next decode step is launched before this one's tokens reach the "
           "host, hiding the host's work under the GPU's (auto, the default: on where the model runs on CUDA)")
    a("--adaptive-threads", choices=["auto", "off"], default="auto",
      help="on the CPU: run each forward with -t threads or one, whichever measured faster lately (a few "
           "probe steps a minute; cores shared with other busy work make -t threads wait for each other, "
           "10x slower at worst). auto (default): on where the model runs on the CPU with -t > 1; off: keep -t")
    a("--no-watch", action="store_true", help="do not watch kernels/ and layouts/ for changes")
    a("--warmup", dest="no_warmup", action="store_false", default=False, help="run the warmup (the default)")
    a("--no-warmup", action="store_true",
      help="skip the warmup run (each weight's repacked form is then built by the first request)")
    a("--no-step-graphs", action="store_true",
      help="run every decode step through the Python forward (no captured step graphs; for A/B runs)")
    a("--no-lab-api", action="store_true",
      help="turn off POST /lab/layout and /lab/reload (403); GET /lab and /lab/events stay readable")
    a("--max-queue", type=int, default=256, metavar="N",
      help="requests that may wait for a slot (default 256; 0: none wait); past it: 503")
    a("--sleep-idle-seconds", type=float, default=-1, metavar="S",
      help="after S seconds without requests, release the weights and the KV cache; the next request "
           "reloads them (default -1: never). /health, /props, /models, /slots and /metrics answer "
           "while asleep without waking it")
    a("--kv-pool-cells", type=int, default=None, metavar="N",
      help="paged layouts: the most KV cells all slots together may hold (default: every slot full); "
           "requests wait for free blocks past it")
    a("-ctk", "--cache-type-k", default="auto", metavar="TYPE",
      help="K cache type: f16 (default with --dtype auto, as llama-server), f32, bf16; int8: --layout q8")
    a("-ctv", "--cache-type-v", default="auto", metavar="TYPE", help="V cache type (the same as K)")
    a("-no-kvu", "--no-kv-unified", dest="kv_unified", action="store_false", default=False,
      help="a KV pool per slot (the default)")
    a("-kvu", "--kv-unified", action="store_true",
      help="llama-server's unified KV: every slot may use the whole --ctx-size, all slots share one pool "
           "of --ctx-size cells (a paged layout)")
    a("--slots-debug", action="store_true", help="show prompt text in GET /slots")
    a("--spm-infill", action="store_true",
      help="/infill: Suffix/Prefix/Middle order instead of Prefix/Suffix/Middle, as some models prefer")
    a("--embedding", "--embeddings", dest="embedding", action="store_true",
      help="embedding-only server (as llama-server): /embedding(s), /v1/embeddings; no completions")
    a("--pooling", choices=["none", "mean", "cls", "last", "rank"], default=None,
      help="pooling for embeddings (default: the model's own, {arch}.pooling_type)")
    a("--embd-normalize", type=int, default=None, metavar="N",
      help="embeddings' normalization unless a request sets embd_normalize: -1 none, 0 max absolute int16, "
           "1 taxicab, 2 euclidean (default), >2 p-norm")
    a("--reranking", "--rerank", dest="reranking", action="store_true",
      help="serve /rerank (and /v1/rerank): --embedding with rank pooling, for a BERT cross-encoder")
    a("-fa", "--flash-attn", choices=["on", "off", "auto", "1", "true", "enabled", "0", "false", "disabled", "-1"],
      nargs="?", const="on", default="auto",
      help="accepted for llama-server's command lines; no effect: attention has one (exact) kernel per "
           "layout here, whatever the setting")
    add_access_args(p)
    add_sampling_args(p)
    add_compat_args(p)
    add_router_args(p)
    p.set_defaults(run=run, serve_parser=p)


def run(args) -> int:
    # Start-up (importing torch, reading the GGUF, building the tokenizer) makes millions of container
    # objects, none of them garbage, and the cyclic collector's full passes over them took ~0.2 s of
    # `import torch` alone (a 0.5B Q4_K_M file healthy in ~2.0 s): paused from before the server's
    # imports until the model thread has loaded the model (LaunchPlan.gc_paused), and at the latest
    # when serving ends (a bad flag, a port in use).
    if is_router(args):
        return run_router(args)
    apply_cpu_affinity(args)   # -C/-Cr: before torch starts its threads
    gc.disable()
    try:
        from slotserver.server.launch import serve
        from slotserver.server.config_from_args import plan_from_args, server_config_from_args
        from slotserver.server.state import ServerState

        log_setup(args, LOG_FORMAT)
        logging.getLogger("uvicorn.error").setLevel(logging.WARNING)  # our own start-up and request lines
        from slotserver.cli.lab import apply_lab_dir

        apply_lab_dir(args)
        fetch_hub_models(args)   # -hf: args.model (and a draft) from the hub, before anything checks them
        config = server_config_from_args(args)
        plan = replace(plan_from_args(args), gc_paused=True)
        tp = start_tp(args)   # --tp N: ranks 1..N-1 run the forward only, no HTTP
        if tp is not None:
            # the watcher (rank 0's lab only) stays as asked: its swaps reach every rank (docs/scaling.md)
            plan = replace(plan, tp=tp, model=replace(plan.model, threads=args.threads))
            tp.check(plan, config.embedding is not None)
            if not tp.leads:
                return tp.serve_worker(plan)
        return serve(ServerState(config), plan)
    finally:
        gc.enable()


def run_router(args) -> int:
    """Router mode: no model in this process (and no torch); one child server per loaded model."""
    from slotserver.router.launch import serve_router

    log_setup(args, LOG_FORMAT)
    logging.getLogger("uvicorn.error").setLevel(logging.WARNING)
    logging.getLogger("httpx").setLevel(logging.WARNING)   # a line per proxied request and health poll
    config, flags = router_config(args, args.serve_parser)
    return serve_router(config, flags)
