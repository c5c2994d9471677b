"""`slotserver serve`'s flags for who may reach the server and how (llama-server's names): API keys,
CORS, the API prefix, HTTPS, the socket (--reuse-port) and what is served besides the API (--path,
--ui-config, --props). The rules they feed are slotserver/access/'s, shared by the
serving server and the router (which keeps them all to itself: cli/router_args.py RESERVED).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from slotserver.access.api_keys import flag_keys
from slotserver.errors import ConfigError


def _keys(value: str) -> str:
    """One --api-key value: it must hold a key (a blank one must not start an open server)."""
    try:
        flag_keys([value])
    except ConfigError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return value


def add_access_args(p: argparse.ArgumentParser) -> None:
    a = p.add_argument
    a("--api-key", action="append", default=[], type=_keys,
      help="require this key (repeatable; a comma-separated list is several keys, as llama-server)")
    a("--api-key-file", type=Path, default=None, help="file with one API key per line (# starts a comment line)")
    a("--cors-origins", "--cors", dest="cors", action="append", default=[], metavar="ORIGINS",
      help="CORS for the inference and info endpoints (default: none, unlike llama-server): comma-separated "
           "origins, * (any) or localhost (any localhost origin); repeatable")
    a("--cors-methods", default="GET, POST, DELETE, OPTIONS", metavar="METHODS",
      help="methods a CORS preflight allows (default: %(default)s)")
    a("--cors-headers", default="*", metavar="HEADERS", help="headers a CORS preflight allows (default: *)")
    a("--cors-credentials", action=argparse.BooleanOptionalAction, default=True,
      help="allow credentials in CORS requests (default on, as llama-server; with * the Origin is echoed)")
    a("--api-prefix", default="", metavar="PREFIX", help="serve every route under PREFIX (/llm), as llama-server")
    a("--ssl-key-file", type=Path, default=None, metavar="FILE",
      help="HTTPS: the PEM private key (with --ssl-cert-file)")
    a("--ssl-cert-file", type=Path, default=None, metavar="FILE",
      help="HTTPS: the PEM certificate (with --ssl-key-file)")
    a("--reuse-port", action="store_true",
      help="SO_REUSEPORT on the listening socket: several servers may bind the same port")
    a("--path", dest="static_path", type=Path, default=None, metavar="PATH",
      help="serve the static files of PATH at / instead of the built-in web page")
    a("--ui-config", "--webui-config", dest="ui_config", default=None, metavar="JSON",
      help="a JSON object of web UI settings, shown in GET /props as ui_settings")
    a("--ui-config-file", "--webui-config-file", dest="ui_config_file", type=Path, default=None, metavar="PATH",
      help="a file holding that JSON object")
    a("--props", dest="props_endpoint", action="store_true",
      help="accept POST /props (it changes no property: none is settable at run time here, nor in llama-server)")
