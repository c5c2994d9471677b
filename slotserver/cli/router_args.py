"""`slotserver serve`'s router flags (llama-server's names) and the RouterConfig they make.

Router mode starts when --models-dir, --models-preset or --models-cache is given (llama-server
starts it when no model is given; here no `-m` means the embedded default model). The router's
other flags (`-c 4096 -np 2 --temp 0`...) are passed to every child; the ones the router owns
(RESERVED: host, port, API keys, the model and alias, the models-* flags, logging, CORS, the API
prefix, HTTPS, --reuse-port, --hf-token: a child gets HF_TOKEN) are not. Flags that came from LLAMA_ARG_* variables go before a preset's options,
the command line's after them, as llama-server's children see them (router/child_args.py).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from slotserver.errors import ConfigError

# flags the router itself answers to; a child never sees them (its own are set by child_args.py)
RESERVED = ("--host", "--port", "--model", "--alias", "--api-key", "--api-key-file", "--log-file", "--log-disable",
            "--models-dir", "--models-preset", "--models-cache", "--models-max", "--models-autoload",
            "--cors-origins", "--cors-methods", "--cors-headers", "--cors-credentials", "--api-prefix",
            "--ssl-key-file", "--ssl-cert-file", "--reuse-port", "--hf-token")


def add_router_args(p: argparse.ArgumentParser) -> None:
    a = p.add_argument
    a("--models-dir", type=Path, default=None, metavar="DIR",
      help="router mode: serve every GGUF in DIR (name.gguf, or a folder name/ with one model), each in its "
           "own child server, picked by the request's `model` field")
    a("--models-preset", type=Path, default=None, metavar="FILE",
      help="router mode: an INI file of model presets (llama-server's format: a section per model, keys are flags)")
    a("--models-cache", type=Path, default=None, metavar="DIR",
      help="router mode: a Hugging Face hub cache whose GGUFs are served as user/repo:TAG (default: llama.cpp's, "
           "LLAMA_CACHE or HF_HUB_CACHE or ~/.cache/huggingface/hub; a preset's hf-repo missing from it is "
           "downloaded there at its first load)")
    a("--models-max", type=int, default=4, metavar="N",
      help="router mode: models loaded at once; past it the least recently used idle one is unloaded "
           "(default 4, 0: no limit)")
    a("--models-autoload", dest="models_autoload", action=argparse.BooleanOptionalAction, default=True,
      help="router mode: load a requested model that is not loaded (default on; per request: ?autoload=)")


def is_router(args) -> bool:
    return any(getattr(args, k) is not None for k in ("models_dir", "models_preset", "models_cache"))


def flag_table(parser: argparse.ArgumentParser) -> dict[str, tuple[str, bool]]:
    """Every option string -> (its canonical spelling, whether it takes a value)."""
    table = {}
    for action in parser._actions:   # argparse has no public list of an instance's options
        longs = [s for s in action.option_strings if s.startswith("--")]
        for opt in action.option_strings:
            negated = isinstance(action, argparse.BooleanOptionalAction) and opt.startswith("--no-")
            table[opt] = (opt if negated or not longs else longs[0], action.nargs != 0)
    return table


def passthrough_argv(argv: list[str], table: dict[str, tuple[str, bool]]) -> list[str]:
    """The router's own command line without the RESERVED flags (and their values)."""
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
            continue
        name, eq, _ = arg.partition("=")
        canonical, takes_value = table.get(name, (name, False))
        if canonical.replace("--no-", "--") in RESERVED:
            skip = takes_value and not eq
            continue
        out.append(arg)
    return out


def router_config(args, parser: argparse.ArgumentParser):
    from slotserver.router.config import RouterConfig, fake_timing_from_env
    from slotserver.hub.cache import default_cache
    from slotserver.access.api_keys import keys_from_args
    from slotserver.access.cors import CorsPolicy
    from slotserver.cli.llama_env import env_flags

    if args.model is not None or args.hf_repo is not None or args.hf_file is not None:
        raise ConfigError("-m/--model (or -hf/-hff) and router mode (--models-dir/--models-preset/--models-cache) "
                          "exclude each other: name hub models in a preset (hf-repo = user/repo:TAG)")
    table = flag_table(parser)
    table |= env_flags(table)   # a preset's LLAMA_ARG_* keys (router/preset_ini.py)
    cache = args.models_cache
    if cache is None and (found := default_cache()) is not None and found.is_dir():
        cache = found
    config = RouterConfig(models_dir=args.models_dir, models_preset=args.models_preset, models_cache=cache,
                          models_max=args.models_max, max_queue=args.max_queue,
                          autoload=args.models_autoload, host=args.host, port=args.port,
                          api_keys=keys_from_args(args), metrics=args.metrics, cors=CorsPolicy.from_args(args),
                          api_prefix=args.api_prefix,
                          ssl_key=args.ssl_key_file, ssl_cert=args.ssl_cert_file, reuse_port=args.reuse_port,
                          child_env_argv=tuple(passthrough_argv(args.env_argv, table)),
                          child_argv=tuple(passthrough_argv(args.serve_argv, table)),
                          child_command=(sys.executable, "-m", "slotserver.cli.main", "serve"),
                          fake_timing=fake_timing_from_env(),
                          # -hft reaches the children as HF_TOKEN, never on a command line /models lists
                          extra_env={"HF_TOKEN": args.hf_token} if args.hf_token else {},
                          offline=bool(getattr(args, "offline", False)))
    return config, table
