"""`slotserver router`: one address in front of several replicas of the same model.

The *replica* router (not llama-server's `--models-dir` router mode, which picks a model by the
request's `model` field): each request goes to the replica most likely to hold its prompt prefix
in cache, falling back to the least loaded one; unhealthy replicas are drained, and a request that
fails before anything was streamed is retried on another. See docs/scaling.md.
"""

from __future__ import annotations

import logging
from pathlib import Path

from slotserver.errors import ConfigError


def add_parser(sub) -> None:
    p = sub.add_parser("router", help="route requests across replicas by cached prompt prefix (docs/scaling.md)",
                       description=__doc__.splitlines()[0])
    p.add_argument("--upstream", action="append", default=[], metavar="URL",
                   help="a replica's base URL, e.g. http://10.0.0.2:8080 (repeatable)")
    p.add_argument("--upstreams-file", type=Path, default=None, metavar="FILE",
                   help="replica URLs, one a line (# comments); re-read when it changes")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8080)
    p.add_argument("--policy", default="prefix", choices=("prefix", "round-robin", "least-loaded"),
                   help="prefix (default): prefix affinity, then consistent hash, then least loaded")
    p.add_argument("--block-bytes", type=int, default=64, metavar="N",
                   help="prefix match granularity, bytes of the prompt text (default 64)")
    p.add_argument("--hash-blocks", type=int, default=4, metavar="N",
                   help="leading blocks the consistent hash covers (default 4)")
    p.add_argument("--balance-slack", type=int, default=2, metavar="N",
                   help="affinity holds until the replica has no free slot and N more requests than the "
                        "least loaded one (default 2)")
    p.add_argument("--health-interval", type=float, default=1.0, metavar="S", help="seconds between health polls")
    p.add_argument("--retries", type=int, default=2, metavar="N",
                   help="other replicas tried when one fails before anything was streamed (default 2)")
    p.add_argument("--read-timeout", type=float, default=600.0, metavar="S",
                   help="longest wait for an upstream's next chunk (default 600)")
    p.add_argument("--upstream-api-key", default=None, metavar="KEY",
                   help="key for the router's own /health, /slots, /metrics polls (client keys pass through)")
    p.set_defaults(run=run)


def build_config(args):
    from slotserver.replicas.config import RouterConfig, RouterConfigError

    try:
        return RouterConfig(upstreams=tuple(args.upstream), upstreams_file=args.upstreams_file, host=args.host,
                            port=args.port, policy=args.policy, block_bytes=args.block_bytes,
                            hash_blocks=args.hash_blocks, balance_slack=args.balance_slack,
                            health_interval=args.health_interval, retries=args.retries,
                            read_timeout=args.read_timeout, upstream_api_key=args.upstream_api_key)
    except RouterConfigError as e:
        raise ConfigError(str(e)) from None


def run(args) -> int:
    import uvicorn

    from slotserver.replicas.app import Router
    from slotserver.replicas.config import RouterConfigError

    config = build_config(args)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)   # not a line per upstream request
    try:
        router = Router(config)
    except RouterConfigError as e:
        raise ConfigError(str(e)) from None
    logging.getLogger("slotserver.replicas").info(
        "replica router on http://%s:%d, policy %s, %d upstreams", config.host, config.port, config.policy,
        len(router.fleet.replicas))
    uvicorn.run(router.app, host=config.host, port=config.port, log_level="warning", access_log=False)
    return 0
