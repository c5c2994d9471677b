"""RouterConfig: what `slotserver serve --models-dir/--models-preset/--models-cache` was started with.

Router mode is llama-server's: this process loads no model; each model runs in a child
`slotserver serve` on a loopback port, and requests are proxied to it by their `model` field.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from slotserver.access.api_prefix import check_prefix
from slotserver.access.cors import CorsPolicy
from slotserver.access.tls import tls_options
from slotserver.errors import ConfigError

DEFAULT_STOP_TIMEOUT_S = 10.0   # llama-server's preset default: SIGTERM, then SIGKILL after this


@dataclass(frozen=True)
class RouterConfig:
    models_dir: Path | None = None      # *.gguf files and folders of them (llama-server's --models-dir)
    models_preset: Path | None = None   # an INI file of presets (llama-server's --models-preset)
    models_cache: Path | None = None    # hub ids as folders: CACHE/user/repo/TAG.gguf (no downloads here)
    models_max: int = 4                 # loaded at once, 0: no limit (llama-server's default 4)
    max_queue: int = 256                # requests that may wait for a model to load; past it: 503
    autoload: bool = True               # --no-models-autoload: a request for an unloaded model is a 400
    host: str = "127.0.0.1"
    port: int = 8080
    api_keys: tuple[str, ...] = ()
    cors: CorsPolicy = CorsPolicy()     # --cors-origins & co.: the router answers CORS; children never see them
    api_prefix: str = ""                # --api-prefix: the router's routes under it (children serve without)
    ssl_key: Path | None = None         # --ssl-key-file / --ssl-cert-file: the router speaks HTTPS (access/tls.py)
    ssl_cert: Path | None = None
    reuse_port: bool = False            # --reuse-port: SO_REUSEPORT on the router's socket
    metrics: bool = False               # --metrics: GET /metrics merges the models' (children get the flag too)
    child_env_argv: tuple[str, ...] = ()   # the router's flags that came from LLAMA_ARG_* variables: under a preset's
    child_argv: tuple[str, ...] = ()    # the router's own flags every child gets (host, port, keys, models-* removed)
    child_command: tuple[str, ...] = ()  # how to start a child server: [python, -m, slotserver.cli.main, serve]
    fake_timing: bool = False           # LLAMA_SERVER_DEBUG_FAKE_TIMING: loads and proxied requests take 2 s longer
    extra_env: dict[str, str] = field(default_factory=dict)
    offline: bool = False   # --offline: children take hub models from the cache; POST /models downloads nothing

    def __post_init__(self) -> None:
        if self.models_max < 0:
            raise ConfigError(f"--models-max must be >= 0, got {self.models_max}")
        if self.models_dir is not None and not self.models_dir.is_dir():
            raise ConfigError(f"--models-dir {self.models_dir}: not a directory")
        if self.models_preset is not None and not self.models_preset.is_file():
            raise ConfigError(f"--models-preset {self.models_preset}: no such file")
        if self.models_cache is not None and not self.models_cache.is_dir():
            raise ConfigError(f"--models-cache {self.models_cache}: not a directory")
        check_prefix(self.api_prefix)
        tls_options(self.ssl_key, self.ssl_cert)
        if not 0 <= self.port <= 65535:
            raise ConfigError(f"--port must be in [0, 65535], got {self.port}")


def fake_timing_from_env() -> bool:
    """llama-server's test hook, honoured under the same name so its router tests run unchanged."""
    return bool(os.environ.get("LLAMA_SERVER_DEBUG_FAKE_TIMING"))
