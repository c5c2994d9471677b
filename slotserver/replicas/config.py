"""RouterConfig: what `slotserver router` was asked to do, validated once at start.

The replica router fronts N copies of the same model (slotserver or llama-server processes) and
sends each request to one of them. It is not llama-server's "router mode" (`--models-dir`, which
picks a *model* by the request's `model` field): every replica here serves the same model, and the
router picks the *replica* most likely to hold the request's prompt prefix in its KV cache.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

POLICIES = ("prefix", "round-robin", "least-loaded")


class RouterConfigError(ValueError):
    """A bad flag or upstreams file: one line for the user (exit status 2)."""


def check_url(raw: str) -> str:
    """An upstream's base URL, without a trailing slash; http(s) with a host, nothing else."""
    url = raw.strip().rstrip("/")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise RouterConfigError(f"upstream {raw!r} is not an http(s) URL such as http://127.0.0.1:8080")
    if parts.query or parts.fragment:
        raise RouterConfigError(f"upstream {raw!r}: a base URL takes no query or fragment")
    return url


def read_upstreams_file(path: Path) -> list[str]:
    """One URL a line; blank lines and `#` comments are skipped. Order kept, duplicates dropped."""
    try:
        text = path.read_text()
    except OSError as e:
        raise RouterConfigError(f"cannot read upstreams file {path}: {e.strerror or e}") from None
    urls: list[str] = []
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if line and (url := check_url(line)) not in urls:
            urls.append(url)
    return urls


@dataclass(frozen=True)
class RouterConfig:
    upstreams: tuple[str, ...] = ()
    upstreams_file: Path | None = None
    host: str = "127.0.0.1"
    port: int = 8080
    policy: str = "prefix"
    block_bytes: int = 64           # granularity of the prefix match (bytes of the canonical UTF-8 text)
    hash_blocks: int = 4            # the consistent hash looks at this many leading blocks
    balance_slack: int = 2          # affinity holds while owner load - least load <= this
    table_size: int = 200_000       # remembered prefix blocks (LRU)
    health_interval: float = 1.0    # seconds between /health (and /slots) polls of each replica
    health_timeout: float = 2.0
    connect_timeout: float = 5.0
    read_timeout: float = 600.0     # between two chunks of an upstream answer
    retries: int = 2                # other replicas tried when one fails before anything was streamed
    upstream_api_key: str | None = None   # for the router's own /health, /slots, /metrics polls
    body_limit: int = 32 * 1024 * 1024

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise RouterConfigError(f"--policy {self.policy!r}: use one of {', '.join(POLICIES)}")
        object.__setattr__(self, "upstreams", tuple(dict.fromkeys(check_url(u) for u in self.upstreams)))
        if not self.upstreams and self.upstreams_file is None:
            raise RouterConfigError("no replica: give --upstream URL (repeatable) or --upstreams-file FILE")
        for name, value, low in (("--block-bytes", self.block_bytes, 8), ("--hash-blocks", self.hash_blocks, 1),
                                 ("--balance-slack", self.balance_slack, 0), ("--table-size", self.table_size, 16),
                                 ("--retries", self.retries, 0), ("--port", self.port, 0)):
            if value < low:
                raise RouterConfigError(f"{name} must be >= {low}, got {value}")
        for name, value in (("--health-interval", self.health_interval), ("--health-timeout", self.health_timeout),
                            ("--connect-timeout", self.connect_timeout), ("--read-timeout", self.read_timeout)):
            if not value > 0:
                raise RouterConfigError(f"{name} must be > 0 seconds, got {value}")

    def initial_upstreams(self) -> list[str]:
        """--upstream URLs, then the file's (checked now, so a bad file fails at start)."""
        urls = list(self.upstreams)
        if self.upstreams_file is not None:
            urls += [u for u in read_upstreams_file(self.upstreams_file) if u not in urls]
        if not urls:
            raise RouterConfigError(f"no replica: {self.upstreams_file} lists no URL")
        return urls
