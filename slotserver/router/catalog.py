"""The router's model list, from llama-server's three sources (later ones win a shared name):

  cache       the Hugging Face hub cache (slotserver/hub/cache.py): `user/repo:TAG`, as llama-server lists
              its download cache (--models-cache DIR, else llama.cpp's cache folder)
  models_dir  --models-dir DIR: `name.gguf` -> `name`; a folder `name/` holding one model GGUF
              (mmproj and draft sidecars as llama-server names them) -> `name`
  preset      --models-preset FILE: a section per model (preset_ini.py); a section named like an
              existing model adds options to it; `hf-repo = user/repo[:TAG]` resolves in the cache, or
              is downloaded by the child when the model loads (its `-hf`)

Option precedence, as llama-server: the router's own command line > the model's section > `[*]`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from slotserver.errors import ConfigError
from slotserver.hub import cache as hub_cache
from slotserver.router.config import DEFAULT_STOP_TIMEOUT_S, RouterConfig
from slotserver.router.preset_ini import Flags, PresetSection, is_true, read_preset_file

DRAFT_PREFIXES = ("mtp-", "dspark-", "dflash-")   # llama-server's draft sidecar names


@dataclass
class ModelEntry:
    name: str
    source: str                                   # cache | models_dir | preset
    path: Path | None = None                      # the GGUF a child serves
    options: dict[str, str] = field(default_factory=dict)   # canonical flag -> value ("true"/"false": switch)
    draft: Path | None = None                     # --model-draft
    load_on_startup: bool = False
    stop_timeout: float = DEFAULT_STOP_TIMEOUT_S
    hidden: bool = False                          # dedup-cache-models: listed nowhere, still usable
    error: str | None = None                      # why it cannot load
    # a preset's hf-repo (ref, hf-file) / spec-draft-hf; while not in the cache (path / draft None) the
    # child gets -hf and downloads it when loaded, as llama-server's children do
    hub: tuple[str, str | None] | None = None
    draft_hub: str | None = None

    def fingerprint(self) -> tuple:
        """What a reload compares: a running model whose fingerprint changed is unloaded."""
        # a hub model by its reference: its download (path None -> cached) is not a change
        return (self.hub or self.path, tuple(sorted(self.options.items())), self.draft_hub or self.draft, self.error)


def scan_cache(cache: Path) -> dict[str, ModelEntry]:
    return {name: ModelEntry(name, "cache", path=path) for name, path in hub_cache.list_models(cache).items()}


def scan_models_dir(folder: Path) -> dict[str, ModelEntry]:
    out = {}
    for item in sorted(folder.iterdir()):
        if item.is_dir():
            ggufs = sorted(item.glob("*.gguf"))
            drafts = [p for p in ggufs if p.name.startswith(DRAFT_PREFIXES)]
            mains = [p for p in ggufs if p not in drafts and "mmproj" not in p.name]
            shards = [p for p in mains if hub_cache.split_info(p.name)[3] > 1 and hub_cache.split_info(p.name)[2] == 1]
            if mains:
                out[item.name] = ModelEntry(item.name, "models_dir", path=(shards or mains)[-1],
                                            draft=drafts[0] if drafts else None)
        elif item.suffix == ".gguf" and "mmproj" not in item.name and not item.name.startswith(DRAFT_PREFIXES) \
                and hub_cache.split_info(item.name)[2] == 1:   # a split GGUF's later parts load through its first
            out[item.stem] = ModelEntry(item.stem, "models_dir", path=item)
    return out


def build_catalog(config: RouterConfig, flags: Flags) -> dict[str, ModelEntry]:
    """Every model the sources name, options cascaded; ConfigError for a bad preset file."""
    models = scan_cache(config.models_cache) if config.models_cache else {}   # None: no cache
    if config.models_dir is not None:
        models.update(scan_models_dir(config.models_dir))
    glob, sections = (read_preset_file(config.models_preset, flags) if config.models_preset
                      else (PresetSection("*"), {}))
    for name, section in sections.items():
        entry = models.get(name) or ModelEntry(name, "preset")
        entry.source = "preset"
        _apply(entry, section, config.models_cache)
        models[name] = entry
    for entry in models.values():
        own = dict(entry.options)
        entry.options = {**glob.options, **own}
        if entry.path is None and entry.hub is None and entry.error is None:
            entry.error = f"preset '{entry.name}' names no model (model = PATH or hf-repo = user/repo)"
    _dedup(models, sections, glob)
    return models


def _apply(entry: ModelEntry, section: PresetSection, cache: Path | None) -> None:
    opts = dict(section.options)
    if "--model" in opts:
        entry.path = Path(opts.pop("--model"))
    if "--spec-draft-model" in opts:
        entry.draft = Path(opts.pop("--spec-draft-model"))
    sp = section.special
    if "hf-repo" in sp:
        entry.hub = (sp["hf-repo"], sp.get("hf-file"))
        try:
            entry.path = hub_cache.resolve(cache, sp["hf-repo"], sp.get("hf-file"))
        except ConfigError:   # not downloaded yet: the child will (-hf)
            entry.path = None
    if "spec-draft-hf" in sp:
        entry.draft_hub = sp["spec-draft-hf"]
        try:
            entry.draft = hub_cache.resolve(cache, sp["spec-draft-hf"])
        except ConfigError:
            entry.draft = None
    if "load-on-startup" in sp:
        entry.load_on_startup = is_true(sp["load-on-startup"])
    if "stop-timeout" in sp:
        entry.stop_timeout = float(sp["stop-timeout"])
    entry.options.update(opts)


def _dedup(models: dict[str, ModelEntry], sections: dict[str, PresetSection], glob: PresetSection) -> None:
    """dedup-cache-models: hide cache entries whose file a deduplicating preset already serves."""
    used = set()
    for name, section in sections.items():
        flag = section.special.get("dedup-cache-models", glob.special.get("dedup-cache-models", "false"))
        if is_true(flag):
            used |= {p for p in (models[name].path, models[name].draft) if p is not None}
    for entry in models.values():
        entry.hidden = entry.source == "cache" and entry.path in used
