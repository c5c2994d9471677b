"""GET /models and /v1/models of a router: every model with its status, llama-server's shape.

    {"object": "list", "data": [{"id", "aliases", "tags", "object": "model", "owned_by": "llamacpp",
      "created", "path", "status": {"value", "args", ["preset"], ["failed", "exit_code"]},
      "architecture": {"input_modalities", "output_modalities"}, "source", "can_remove", ...}]}

A running model's entry also carries the fields of its child's own /v1/models entry (its `meta`:
vocabulary, context, parameter count), as llama-server merges its child's loaded_info.
"""

from __future__ import annotations

import time

from slotserver.router.catalog import ModelEntry
from slotserver.router.instance import Instance


def preset_ini(entry: ModelEntry) -> str:
    """The options a model runs with, as an INI section (llama-server's `status.preset`)."""
    lines = [f"[{entry.name}]"]
    if entry.path is not None:
        lines.append(f"model = {entry.path}")
    elif entry.hub is not None:
        lines += [f"hf-repo = {entry.hub[0]}", *([f"hf-file = {entry.hub[1]}"] if entry.hub[1] else [])]
    lines += [f"{flag.lstrip('-')} = {'(hidden)' if flag in SECRETS else value}" for flag, value in entry.options.items()]
    return "\n".join(lines) + "\n"


SECRETS = ("--hf-token", "-hft", "--api-key")   # flags whose values /models (public) never shows


def shown_args(args) -> list[str]:
    """A child's command line as /models lists it: the values of SECRETS flags hidden."""
    out = list(args)
    for i, a in enumerate(out):
        flag, eq, _ = a.partition("=")
        if flag in SECRETS:
            if eq:
                out[i] = f"{flag}=(hidden)"
            elif i + 1 < len(out):
                out[i + 1] = "(hidden)"
    return out


def model_json(entry: ModelEntry, inst: Instance, created: int) -> dict:
    status: dict = {"value": inst.status, "args": shown_args(inst.args)}
    if entry.source == "preset":
        status["preset"] = preset_ini(entry)
    if inst.failed:
        status["failed"], status["exit_code"] = True, inst.exit_code
    if entry.error:
        status["error"] = entry.error
    out = entry_json(entry.name, status, entry.path, entry.source, created)
    if inst.running and inst.info:
        out.update({k: v for k, v in inst.info.items() if k not in out})
    return out


def entry_json(name: str, status: dict, path, source: str, created: int) -> dict:
    """One model of the list in llama-server's shape (a catalog entry's, or a download's: downloads.py)."""
    return {"id": name, "aliases": [], "tags": [], "object": "model", "owned_by": "llamacpp", "created": created,
            "path": str(path) if path else None, "status": status,
            "architecture": {"input_modalities": ["text"], "output_modalities": ["text"]},
            "source": source, "can_remove": source == "cache"}


def models_json(catalog: dict[str, ModelEntry], instances: dict[str, Instance]) -> dict:
    created = int(time.time())
    data = [model_json(entry, instances[name], created) for name, entry in catalog.items()
            if not entry.hidden and name in instances]
    return {"object": "list", "data": data}
