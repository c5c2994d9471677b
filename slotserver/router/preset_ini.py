"""llama-server's model preset INI (`--models-preset FILE`): sections of command-line options.

    version = 1            ; skipped, as llama-server does
    [*]                    ; options every model gets (a model's own section wins)
    c = 8192
    [my-model]             ; a model: `model = PATH`, or `hf-repo = user/repo[:tag]` from the models cache
    model = /models/x.gguf
    ctx-size = 4096        ; long flag names, short ones (c, np), or LLAMA_ARG_* environment names
    jinja = true           ; a switch: true/false (false gives --no-X where the flag has one)

`load-on-startup`, `stop-timeout` and `dedup-cache-models` are the preset-only keys llama-server has.
An unknown key is a ConfigError naming it and its section, as llama-server refuses it.
"""

from __future__ import annotations

import configparser
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

from slotserver.errors import ConfigError

PRESET_ONLY = ("load-on-startup", "stop-timeout", "dedup-cache-models")
# hub references, resolved against --models-cache by the catalog (not there yet: the child's -hf downloads)
HUB_KEYS = {"hf-repo": "hf-repo", "hf": "hf-repo", "hfr": "hf-repo", "LLAMA_ARG_HF_REPO": "hf-repo",
            "hf-file": "hf-file", "hff": "hf-file", "LLAMA_ARG_HF_FILE": "hf-file",
            "spec-draft-hf": "spec-draft-hf", "hf-repo-draft": "spec-draft-hf", "hfd": "spec-draft-hf",
            "LLAMA_ARG_SPEC_DRAFT_HF_REPO": "spec-draft-hf"}
# every option string of `slotserver serve` -> (its canonical spelling, whether it takes a value)
Flags = Mapping[str, tuple[str, bool]]
TRUE = {"1", "true", "on", "yes", "enabled"}
FALSE = {"0", "false", "off", "no", "disabled"}


@dataclass
class PresetSection:
    """One section: `options` by long flag (`--ctx-size` -> "4096", a switch -> "true"/"false")."""
    name: str
    options: dict[str, str] = field(default_factory=dict)
    special: dict[str, str] = field(default_factory=dict)   # PRESET_ONLY and HUB_KEYS keys


def is_true(value: str) -> bool:
    v = value.strip().lower()
    if v not in TRUE | FALSE:
        raise ConfigError(f"expected a boolean (true/false), got {value!r}")
    return v in TRUE


def flag_for(key: str, flags: Flags) -> str:
    """The flag a preset key names, in its canonical (first long) spelling: `ctx-size`, `c` and
    `LLAMA_ARG_CTX_SIZE` all give `--ctx-size` (a variable through llama.cpp's own table when
    `flags` carries it: cli/llama_env.py env_flags); KeyError when the server has no such flag."""
    if key in flags and not key.startswith("-"):
        return flags[key][0]
    if key.startswith("LLAMA_ARG_"):
        key = key[len("LLAMA_ARG_"):].lower().replace("_", "-")
    for candidate in (f"--{key}", f"-{key}"):
        if candidate in flags:
            return flags[candidate][0]
    raise KeyError(key)


def read_preset_file(path: Path, flags: Flags) -> tuple[PresetSection, dict[str, PresetSection]]:
    """-> (the `[*]` section, {model name: its section}); ConfigError for a bad file or key."""
    parser = configparser.ConfigParser(interpolation=None, delimiters=("=",), comment_prefixes=(";", "#"),
                                       inline_comment_prefixes=(";",), strict=False,
                                       default_section="\x00no-default")
    parser.optionxform = str   # keys keep their case (LLAMA_ARG_*)
    try:
        text = path.read_text(encoding="utf-8")
        parser.read_string("[\x00top]\n" + text, source=str(path))
    except configparser.ParsingError as e:   # line numbers: the file's (one line was put before it)
        lineno = e.errors[0][0] - 1
        line = text.splitlines()[lineno - 1].strip()
        raise ConfigError(f"--models-preset {path}: line {lineno}: {line!r} is not `key = value`") from None
    except (OSError, UnicodeDecodeError, configparser.Error) as e:
        raise ConfigError(f"--models-preset {path}: {' '.join(str(e).split())}") from None
    glob, models = PresetSection("*"), {}
    for name in parser.sections():
        section = _section(name, parser[name], flags)
        if name == "\x00top":
            glob.options.update(section.options)    # keys before any section: global, as llama-server
            glob.special.update(section.special)
        elif name == "*":
            glob.options.update(section.options)
            glob.special.update(section.special)
        else:
            models[name] = section
    return glob, models


def _section(name: str, items: Mapping[str, str], flags: Flags) -> PresetSection:
    out = PresetSection(name)
    for key, value in items.items():
        value = value.strip()
        if key == "version":
            continue
        if key in PRESET_ONLY or key in HUB_KEYS:
            out.special[HUB_KEYS.get(key, key)] = value
            continue
        try:
            flag = flag_for(key, flags)
        except KeyError:
            raise ConfigError(f"--models-preset: option '{key}' not recognized in preset '{name}'") from None
        if not flags[flag][1]:   # a switch: validated here, rendered by child_args
            try:
                value = "true" if is_true(value) else "false"
            except ConfigError as e:
                raise ConfigError(f"--models-preset: [{name}] {key}: {e}") from None
        out.options[flag] = value
    return out
