"""HTTPS (`--ssl-key-file`, `--ssl-cert-file`, llama-server's): both files or neither, checked before
the port is bound; uvicorn then serves TLS on it, and only TLS. Shared by the server and the router
(a router's children stay plain HTTP on loopback).
"""

from __future__ import annotations

import ssl
from pathlib import Path

from slotserver.errors import ConfigError


def tls_options(key: Path | None, cert: Path | None) -> dict:
    """uvicorn.Config's keyword arguments for this pair ({} for plain HTTP); a ConfigError naming
    the flag for half a pair, an unreadable file, or a key that does not match the certificate."""
    if key is None and cert is None:
        return {}
    if key is None or cert is None:
        raise ConfigError("--ssl-key-file and --ssl-cert-file go together: give both for HTTPS")
    for flag, path in (("--ssl-key-file", key), ("--ssl-cert-file", cert)):
        if not Path(path).is_file():
            raise ConfigError(f"{flag} {path}: no such file")
    try:
        ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(str(cert), str(key))
    except (ssl.SSLError, OSError) as e:
        raise ConfigError(f"--ssl-key-file {key} / --ssl-cert-file {cert}: {e.strerror or e}") from None
    return {"ssl_keyfile": str(key), "ssl_certfile": str(cert)}
