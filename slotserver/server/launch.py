"""Starting the server: bind first, load the model in a background thread, then serve.

The socket is bound before anything slow happens, so a port already in use fails at once and
health checks can connect while the model loads (they get 503 "Loading model" until it is
ready). If loading fails, the server stops and `serve` exits with status 2 and one line.
"""

from __future__ import annotations

import gc
import logging
import os
import signal
import sys
import threading
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from slotserver.access.listen import bind
from slotserver.access.tls import tls_options
from slotserver.model.config import ConfigError, ModelConfig
from slotserver.engine.config import EngineConfig
from slotserver.server.app import create_app
from slotserver.server.state import ServerState

if TYPE_CHECKING:
    from slotserver.engine.engine import Engine

log = logging.getLogger("slotserver.server")
GRACEFUL_SHUTDOWN_S = 5


@dataclass(frozen=True)
class LaunchPlan:
    model: ModelConfig
    engine: EngineConfig
    host: str = "127.0.0.1"
    port: int = 8080
    chat_template: str | None = None   # a Jinja source from the command line, else the model's
    watch: bool = True                 # hot-reload saves in kernels/ and layouts/ (--no-watch: off)
    warmup: bool = True                # prepare every weight before healthy (--no-warmup: off, as llama-server)
    check_tensors: bool = False        # --check-tensors: refuse a file whose tensor data holds NaN/inf (as llama.cpp)
    gc_paused: bool = False            # start-up ran with the cyclic GC paused (cli/serve.py): resume it once loaded
    tp: object = None                  # --tp N's rank 0 (slotserver/parallel/session.py TPSession), else None
    ssl_key: Path | None = None        # --ssl-key-file / --ssl-cert-file: HTTPS (access/tls.py)
    ssl_cert: Path | None = None
    reuse_port: bool = False           # --reuse-port: SO_REUSEPORT, several servers on one port

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise ConfigError(f"--port must be in [0, 65535], got {self.port}")
        tls_options(self.ssl_key, self.ssl_cert)


def load(state: ServerState, plan: LaunchPlan, address: str) -> Engine:
    """Load bundle and engine, publish them in `state`, print the summary line; -> the engine, not yet running."""
    from slotserver.model.bundle import ModelBundle
    from slotserver.engine.engine import Engine
    from slotserver.engine.atomic_file import remove_stale_temporaries
    from slotserver.model.progress import load_progress, stage

    if state.config.embedding is not None:   # --embedding: an embedding-only server, no engine
        from slotserver.server.embed_launch import load_embedder
        return load_embedder(state, plan, address)   # type: ignore[return-value]  (runs and stops like one)
    name = plan.model.model_path.name
    with stage(f"loading {name}", f"loaded {name}"), load_progress(f"loading {name}") as tick:
        bundle = ModelBundle.load(plan.model, tick, check_tensors=plan.check_tensors)
    if plan.tp is not None:   # --tp: this rank's slice of the weights; forwards go to every rank
        plan.tp.prepare(bundle.model)
    if plan.warmup:
        with stage("warming up: each weight's repacked form (--no-warmup skips it)", "warmed up"):
            bundle.model.warm_up()
    template = None
    if plan.chat_template is not None:   # same BOS/EOS texts and BOS rule as the model's own
        template = bundle.template.with_source(plan.chat_template)
    elif not bundle.template.from_model:
        print(f"slotserver: warning: {plan.model.model_path.name} has no chat template "
              "(tokenizer.chat_template); chat prompts use ChatML, as llama-server's do. Give the "
              "model's own with --chat-template-file", file=sys.stderr, flush=True)
    draft = _load_draft(plan)
    with stage(f"allocating the KV cache ({plan.engine.n_parallel} slots x {plan.engine.n_cells} cells)",
               "KV cache allocated"):
        engine = Engine(bundle, plan.engine, draft)
    if plan.tp is not None:   # KV edits go to every rank; each rank's memory logged and in /props
        plan.tp.attach(engine)
    remove_stale_temporaries(plan.engine.slot_save_path)   # before any save can run: none is live
    state.set_loaded(bundle, engine, template)
    e, layout = plan.engine, engine.stats().layout or plan.model.layout
    print(f"slotserver: {plan.model.model_path.name} ({plan.model.dtype}, layout {layout}), "
          f"{e.n_parallel} slots x {e.n_cells} ctx, listening on {address}", file=sys.stderr, flush=True)
    return engine


def _load_draft(plan: LaunchPlan):
    """-md: the draft model of --spec-type draft-simple, read as the model is (same dtype, weights,
    device, threads) with its default layout; None when no type needs it."""
    from slotserver.model.bundle import ModelBundle
    from slotserver.model.config import DEFAULT_LAYOUT
    from slotserver.model.progress import load_progress, stage

    spec = plan.engine.spec
    if "draft-simple" not in spec.types:
        return None
    name = spec.draft_model.name
    with stage(f"loading the draft model {name}", f"loaded {name}"), load_progress(f"loading {name}") as tick:
        # the target's LoRA adapters and control vectors stay the target's (llama.cpp applies none to the draft)
        draft = ModelBundle.load(replace(plan.model, model_path=spec.draft_model, layout=DEFAULT_LAYOUT, lora=(),
                                         lora_init_without_apply=False, control_vectors=()), tick)
    if plan.warmup:
        draft.model.warm_up()
    return draft


class ModelThread:
    """Loads the model, publishes it, then runs the engine loop on this same thread until shutdown.

    Why one thread: every thread that runs parallel torch ops keeps its own OpenMP team, and once
    the process has more OpenMP threads than cores, libgomp stops spin-waiting between ops, which
    made each decode step 1.6-1.9x slower on 2 cores (docs/performance.md). So loading, the KV cache's
    allocation and every forward happen here, and no other thread of the server runs torch work.
    """

    def __init__(self, state: ServerState, plan: LaunchPlan, address: str,
                 on_failure: Callable[[str], None]) -> None:
        self.state, self.plan, self.address, self.on_failure = state, plan, address, on_failure
        self.stop_event = threading.Event()
        self.thread = threading.Thread(target=self._run, name="slotserver-engine", daemon=True)

    def start(self) -> "ModelThread":
        self.thread.start()
        return self

    def stop(self, timeout: float = 30.0) -> None:
        self.stop_event.set()
        if self.state.engine is not None:
            self.state.engine.stop()
        if self.state.embedder is not None:
            self.state.embedder.stop()
        self.thread.join(timeout)

    def _run(self) -> None:
        try:
            engine = load(self.state, self.plan, self.address)
        except Exception as e:  # noqa: BLE001 - reported as one line, then the server stops
            log.debug("model loading failed", exc_info=True)
            self.state.load_error = str(e) or type(e).__name__
            self.on_failure(self.state.load_error)
            return
        finally:
            if self.plan.gc_paused:   # what start-up made lives as long as the server: frozen, later
                gc.freeze()           # collections skip it (they traversed it all on every full pass)
                gc.enable()
        try:
            if not self.stop_event.is_set():
                engine.run(watch=self.plan.watch)
        finally:
            if self.plan.tp is not None:   # --tp: the other ranks leave their loop
                self.plan.tp.stop()


def _exit_on_sigterm(signum, frame) -> None:
    """SIGTERM after uvicorn's graceful shutdown: uvicorn re-raises the signal it caught once it has
    stopped, and the default action would end the process before `serve`'s cleanup (the engine's
    stop, which writes --cache-disk's entries). Raised as SystemExit, the cleanup runs first."""
    raise SystemExit(0)


def http_stack() -> dict[str, str]:
    """uvicorn's HTTP protocol and event loop: h11, and uvloop (a dependency) where it is installed.
    Not httptools: its protocol lowercases every response header name, and llama-server's clients
    read `Process-Start-Time-Unix` (GET /metrics) from a plain dict with its capitals (llama.cpp's
    own server tests do); h11 writes names as given. `SLOTSERVER_LOOP=asyncio` keeps the standard
    loop, for an A/B of the per-token host work (playground/http_overhead.py)."""
    loop = os.environ.get("SLOTSERVER_LOOP", "auto")
    if loop not in ("auto", "asyncio"):
        raise SystemExit(f"SLOTSERVER_LOOP={loop!r}: expected auto or asyncio")
    return {"http": "h11", "loop": loop}


def serve(state: ServerState, plan: LaunchPlan) -> int:
    """Run until interrupted; -> exit status (2 if the model failed to load)."""
    import uvicorn

    sock = bind(plan.host, plan.port, plan.reuse_port)
    sock.set_inheritable(True)
    host = f"[{plan.host}]" if ":" in plan.host else plan.host
    tls = tls_options(plan.ssl_key, plan.ssl_cert)
    address = f"{'https' if tls else 'http'}://{host}:{sock.getsockname()[1]}"
    config = uvicorn.Config(create_app(state), log_config=None, access_log=False, lifespan="off",
                            timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S, **http_stack(), **tls)
    server = uvicorn.Server(config)
    failed: list[str] = []

    def on_failure(message: str) -> None:
        failed.append(message)
        server.should_exit = True

    model = ModelThread(state, plan, address, on_failure).start()
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        server.run(sockets=[sock])
    finally:
        model.stop()
        sock.close()
    if failed:
        print(f"slotserver: error: {failed[0]}", file=sys.stderr)
        return 2
    return 0
