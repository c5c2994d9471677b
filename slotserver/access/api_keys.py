"""API keys (`--api-key`, `--api-key-file`): `Authorization: Bearer KEY` or `X-Api-Key: KEY`.

`X-Api-Key` is how Anthropic's clients send their key (llama-server reads it when there is no
Authorization header); a request passes when either header holds a valid key, so a proxy's own
Authorization header does not hide the client's X-Api-Key.

As in llama-server, /health, /v1/health, /models and /v1/models stay public to GET (health checks
and model discovery; the router's POST and DELETE /models download and delete models, and need a
key), and CORS preflight requests pass (a browser sends no key with them). Keys are
compared with `hmac.compare_digest` against every configured key, so timing does not reveal a
key's prefix. The middlewares that answer a refusal live with their apps (server/auth.py,
router/auth.py): each answers in its own error shape.
"""

from __future__ import annotations

import csv
import hmac
from pathlib import Path

from starlette.datastructures import Headers
from starlette.types import Scope

from slotserver.errors import ConfigError

PUBLIC_PATHS = frozenset({"/health", "/v1/health", "/models", "/v1/models"})


def flag_keys(values: list[str]) -> list[str]:
    """`--api-key` values: each a comma-separated list (CSV quoting, as llama-server's); surrounding
    whitespace is dropped, as in a key file, and so are empty items. A value with no key at all
    (`--api-key ""`, an unset `LLAMA_API_KEY=${KEY}`) is a ConfigError: it must not start a server
    without authentication."""
    keys = []
    for value in values:
        found = [k.strip() for k in next(csv.reader([value], skipinitialspace=True), []) if k.strip()]
        if not found:
            raise ConfigError(f"--api-key {value!r} holds no key")
        keys += found
    return keys


def keys_from_args(args) -> tuple[str, ...]:
    """--api-key (repeatable, comma-separated) and --api-key-file, as the server and the router read them."""
    return tuple(flag_keys(args.api_key)) + (tuple(read_key_file(args.api_key_file)) if args.api_key_file else ())


def read_key_file(path: Path) -> list[str]:
    """One key per line; blank lines, lines starting with `#` (comments, as in llama-server) and
    surrounding whitespace are ignored."""
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"--api-key-file {path}: {e.strerror if isinstance(e, OSError) else e}") from None
    keys = [line.strip() for line in lines if line.strip() and not line.strip().startswith("#")]
    if not keys:
        raise ConfigError(f"--api-key-file {path} holds no key")
    return keys


def presented_keys(headers: Headers) -> list[str]:
    """The keys a request presents: the Authorization header's bearer token, then X-Api-Key."""
    keys = []
    auth = headers.get("authorization", "")
    if auth[:7].lower() == "bearer ":
        keys.append(auth[7:].strip())
    if headers.get("x-api-key") is not None:
        keys.append(headers["x-api-key"])
    return keys


def key_matches(given: str, keys: tuple[str, ...]) -> bool:
    given_b = given.encode("utf-8", "replace")
    ok = False
    for key in keys:  # no early exit: the time taken does not depend on which key matched
        ok |= hmac.compare_digest(given_b, key.encode("utf-8"))
    return ok


def needs_key(scope: Scope, keys: tuple[str, ...], public: frozenset[str] = PUBLIC_PATHS,
              public_prefixes: tuple[str, ...] = ()) -> bool:
    """True when this request must present a key: keys are configured, it is HTTP, not a preflight
    (OPTIONS), and its path is neither one of `public` nor under one of `public_prefixes`."""
    path = scope.get("path", "")
    readable = scope.get("method") in ("GET", "HEAD") and (   # public paths are public to read only:
        path in public or any(path.startswith(prefix) for prefix in public_prefixes))   # POST/DELETE /models need a key
    return scope["type"] == "http" and bool(keys) and scope["method"] != "OPTIONS" and not readable


def refused(scope: Scope, keys: tuple[str, ...], public: frozenset[str] = PUBLIC_PATHS,
            public_prefixes: tuple[str, ...] = ()) -> bool:
    """True when the request needs a key and presents none that matches."""
    if not needs_key(scope, keys, public, public_prefixes):
        return False
    given = presented_keys(Headers(scope=scope))
    return not any([key_matches(key, keys) for key in given])   # a list: every presented key is compared
