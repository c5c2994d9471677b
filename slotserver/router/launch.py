"""`serve_router`: bind, read the model list, serve; at shutdown every child is stopped first.

The catalog is read before serving, so a bad --models-preset is one line and exit status 2.
The socket is bound here rather than through server/launch.py's `bind`, which would load torch
into the router (slotserver.server imports the engine); a router needs neither.
"""

from __future__ import annotations

import contextlib
import logging
import sys

from slotserver.access.listen import bind
from slotserver.access.tls import tls_options
from slotserver.router.app import create_router_app
from slotserver.router.config import RouterConfig
from slotserver.router.models import ModelRouter
from slotserver.router.preset_ini import Flags

log = logging.getLogger("slotserver.router")
GRACEFUL_SHUTDOWN_S = 5


def serve_router(config: RouterConfig, flags: Flags) -> int:
    import uvicorn

    @contextlib.asynccontextmanager
    async def lifespan(app):
        router = app.state.router
        await router.load_startup_models()
        try:
            yield
        finally:
            await router.stop_all()

    router = ModelRouter(config, flags)   # reads the sources: a bad preset stops here
    sock = bind(config.host, config.port, config.reuse_port)
    app = create_router_app(router)
    app.router.lifespan_context = lifespan
    names = ", ".join(n for n, e in router.catalog.items() if not e.hidden) or "none"
    tls = tls_options(config.ssl_key, config.ssl_cert)
    print(f"slotserver: router mode, {len(router.catalog)} models ({names}), at most "
          f"{config.models_max or 'any number'} loaded, listening on {'https' if tls else 'http'}://{config.host}:"
          f"{sock.getsockname()[1]}",
          file=sys.stderr, flush=True)
    server = uvicorn.Server(uvicorn.Config(app, log_config=None, access_log=False, lifespan="on",
                                           timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S, **tls))
    try:
        server.run(sockets=[sock])
    finally:
        sock.close()
    return 0
