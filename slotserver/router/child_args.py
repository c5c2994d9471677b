"""A child server's command line from its catalog entry and the router's own flags.

Order decides precedence (argparse: the last value of a flag wins): the preset's options (`[*]`
then the model's section, already merged by the catalog), then the router's own command line,
then what the router controls: the model file (or `-hf` for a preset's hf-repo not yet in the
cache), the draft, loopback host, port and alias (the child's /v1/models id is the router's model name).
"""

from __future__ import annotations

from slotserver.router.catalog import ModelEntry
from slotserver.router.config import RouterConfig
from slotserver.router.preset_ini import Flags


def option_args(options: dict[str, str], flags: Flags) -> list[str]:
    out: list[str] = []
    for flag, value in options.items():
        if flags.get(flag, (flag, True))[1]:
            out += [flag, value]
        elif value == "true":
            out.append(flag)
        elif flag.startswith("--") and f"--no-{flag[2:]}" in flags:
            out.append(f"--no-{flag[2:]}")
        elif flag.startswith("--no-") and f"--{flag[5:]}" in flags:
            out.append(f"--{flag[5:]}")
    return out


def child_argv(entry: ModelEntry, config: RouterConfig, flags: Flags, port: int) -> list[str]:
    assert entry.path is not None or entry.hub is not None
    # llama-server's order: the router's variables, then the preset, then the router's command line
    own = {k: v for k, v in entry.options.items() if k != "--alias"}   # the router names its children
    argv = [*config.child_command, *_last_only([*config.child_env_argv, *option_args(own, flags), *config.child_argv])]
    if entry.path is not None:
        argv += ["--model", str(entry.path)]
    elif entry.hub is not None:   # a preset's hf-repo not in the cache: the child downloads it (cli/hub_args.py)
        ref, file = entry.hub
        argv += ["-hf", ref, *(["-hff", file] if file else [])]
    if entry.draft is not None:
        argv += ["--model-draft", str(entry.draft)]
    elif entry.draft_hub is not None:
        argv += ["--spec-draft-hf", entry.draft_hub]
    return argv + ["--host", "127.0.0.1", "--port", str(port), "--alias", entry.name]


# flags that add up when repeated here but that llama-server's children take once (the last source wins)
SINGLE = ("--spec-type", "--tags")


def _last_only(argv: list[str]) -> list[str]:
    """argv with only the last occurrence of each SINGLE flag (`--flag V` or `--flag=V`)."""
    spans: dict[str, list[tuple[int, int]]] = {}
    i = 0
    while i < len(argv):
        name, eq, _ = argv[i].partition("=")
        if name in SINGLE:
            width = 1 if eq else 2
            spans.setdefault(name, []).append((i, i + width))
            i += width
        else:
            i += 1
    drop = {k for runs in spans.values() for a, b in runs[:-1] for k in range(a, b)}
    return [a for k, a in enumerate(argv) if k not in drop]
