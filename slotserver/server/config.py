"""Validated settings of the HTTP layer (the engine and model have their own config objects)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from slotserver.access.api_prefix import check_prefix
from slotserver.access.cors import CorsPolicy
from slotserver.model.config import ConfigError
from slotserver.server.body import DEFAULT_BODY_LIMIT
from slotserver.server.chat_options import ChatDefaults
from slotserver.server.embed_config import EmbeddingConfig


@dataclass(frozen=True)
class GenerationDefaults:
    """Per-request defaults set on the command line (`-n`, `--temp`, `--seed`, `--cache-prompt`,
    `--reasoning-budget`, `--reasoning-budget-message`: budget_fields.py), and `fields`: the other
    request fields llama-server's sampling flags set, by request name (cli/sampling_args.py), read
    under each body (Fields' fallback)."""

    n_predict: int = -1
    temperature: float = 0.8
    seed: int = -1
    cache_prompt: bool = True
    reasoning_budget: int = -1          # -1: unlimited
    reasoning_budget_message: str = ""  # forced before the end tag when the budget runs out
    sse_ping_interval: int = 30         # streamed answers: seconds of silence before a ping (-1: none)
    special: bool = False               # --special: control tokens' text in answers (engine/request.py)
    fields: Mapping[str, Any] = field(default_factory=dict, hash=False)   # {"top_k": 20, ...}: --top-k & co.

    def __post_init__(self) -> None:
        if self.n_predict < -1:
            raise ConfigError(f"--n-predict must be >= -1, got {self.n_predict}")
        if not math.isfinite(self.temperature):
            raise ConfigError(f"--temp must be a finite number, got {self.temperature}")
        if not -1 <= self.seed < 2**32:
            raise ConfigError(f"--seed must be -1 or in [0, 2^32), got {self.seed}")
        if not -1 <= self.reasoning_budget < 2**31:
            raise ConfigError(f"--reasoning-budget must be -1 (unlimited) or a number of tokens >= 0, "
                              f"got {self.reasoning_budget}")
        if "grammar" in self.fields and "json_schema" in self.fields:
            raise ConfigError("--grammar/--grammar-file and --json-schema/--json-schema-file exclude each other")
        if not -1 <= self.sse_ping_interval < 2**31:
            raise ConfigError(f"--sse-ping-interval must be -1 (no pings) or a number of seconds, got {self.sse_ping_interval}")
        if not isinstance(self.reasoning_budget_message, str):
            raise ConfigError("--reasoning-budget-message must be a string")


@dataclass(frozen=True)
class ServerConfig:
    """What the routes need to know about how the server was started.

    `api_keys` empty means no authentication. `cors` with no origins means no CORS headers at all.
    `slots_debug` is the only way prompt text appears in GET /slots. `lab_api` false
    (`--no-lab-api`) turns off the lab's verbs over HTTP (POST /lab/layout, /lab/reload).
    """

    model_path: str = ""
    alias: str = ""                    # --alias: comma-separated names (the first sorted is the id)
    tags: str = ""                     # --tags: comma-separated, informational (/v1/models)
    api_keys: tuple[str, ...] = ()
    cors: CorsPolicy = CorsPolicy()   # --cors-origins & co. (access/cors.py)
    api_prefix: str = ""               # --api-prefix: every route under it (access/api_prefix.py)
    slots_endpoint: bool = True
    slots_debug: bool = False
    metrics: bool = False
    lab_api: bool = True
    slot_save_path: Path | None = None
    body_limit: int = DEFAULT_BODY_LIMIT
    timeout: float = 600.0
    defaults: GenerationDefaults = field(default_factory=GenerationDefaults)
    chat: ChatDefaults = field(default_factory=ChatDefaults)   # reasoning format, template kwargs
    embedding: EmbeddingConfig | None = None   # --embedding/--reranking: an embedding-only server (embed_config.py)
    spm_infill: bool = False   # --spm-infill: /infill puts the suffix before the prefix (infill_prompt.py)
    webui: bool = True   # --no-webui: no page at / (routes/webui.py)
    static_path: Path | None = None   # --path: its files at / instead of the web page (app.py)
    ui_settings: dict = field(default_factory=dict)   # --ui-config(-file): /props ui_settings
    props_endpoint: bool = False      # --props: POST /props answered (routes/misc.py)

    def __post_init__(self) -> None:
        if any(not isinstance(k, str) or not k for k in self.api_keys):
            raise ConfigError("--api-key values must be non-empty strings")
        check_prefix(self.api_prefix)
        if self.body_limit <= 0:
            raise ConfigError(f"body limit must be positive, got {self.body_limit}")
        if not (math.isfinite(self.timeout) and self.timeout > 0):
            raise ConfigError(f"--timeout must be a positive number of seconds, got {self.timeout}")
        if not isinstance(self.spm_infill, bool):
            raise ConfigError(f"spm_infill must be true or false, got {self.spm_infill!r}")
        if self.static_path is not None and not Path(self.static_path).is_dir():
            raise ConfigError(f"--path {self.static_path} is not a folder")
        if not isinstance(self.ui_settings, dict):
            raise ConfigError("--ui-config must be a JSON object")

    @property
    def aliases(self) -> list[str]:
        """`--alias a,b`'s names (llama-server's: comma-separated, blank ones dropped), in the order
        of its std::set, which makes the first in sorted order the model's id."""
        return sorted({a.strip() for a in self.alias.split(",") if a.strip()})

    @property
    def tag_list(self) -> list[str]:
        """`--tags`: informational tags, comma-separated, shown in /v1/models (sorted, once each: llama-server's set)."""
        return sorted({t.strip() for t in self.tags.split(",") if t.strip()})

    @property
    def model_name(self) -> str:
        """The model id clients see: `--alias` (its first name), else the model file's name, as
        llama-server forms it; short and the same wherever the file is installed (the full path was
        the id before)."""
        return next(iter(self.aliases), "") or Path(self.model_path).name or "slotserver"

    def knows_model(self, model_id: str) -> bool:
        """Whether GET /v1/models/{id} describes this model: its id, any alias, or the full path that
        was its id before, so a client that stored the old id still finds it."""
        return model_id in (self.model_name, *self.aliases) or (bool(self.model_path) and model_id == self.model_path)
