"""What every route shares: the server's config and, once loaded, the model bundle and engine.

The loader thread fills `bundle`, `template` and then `engine` (one assignment each); routes
check `ready` first and answer 503 "Loading model" until then. Routes never touch slots or
tensors: they submit requests and read the engine's immutable stats snapshots.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from slotserver.server.errors import loading_error, not_supported
from slotserver.server.metrics import ServerMetrics
from slotserver.server.config import ServerConfig

if TYPE_CHECKING:
    from slotserver.model.bundle import ModelBundle
    from slotserver.model.text.chat_template import ChatTemplate
    from slotserver.engine.engine import Engine
    from slotserver.server.embed_worker import EmbedWorker


class ServerState:
    def __init__(self, config: ServerConfig | None = None) -> None:
        self.config = config or ServerConfig()
        self.bundle: ModelBundle | None = None
        self.template: ChatTemplate | None = None
        self.engine: Engine | None = None
        # --embedding: an embedding-only server has this instead of an engine (embed_launch.py)
        self.embedder: EmbedWorker | None = None
        self.load_error: str | None = None
        self.created = int(time.time())
        # In-flight request id -> prompt text, kept only with --slots-debug (GET /slots shows it).
        self.prompts: dict[int, str] = {}
        self.metrics = ServerMetrics(self._stats, self.lab)

    @property
    def ready(self) -> bool:
        return self.engine is not None or self.embedder is not None

    def set_loaded(self, bundle: ModelBundle, engine: Engine, template: ChatTemplate | None = None) -> None:
        """Publish a loaded model; the engine goes last, since `ready` reads it."""
        self.bundle = bundle
        self.template = template or bundle.template
        self.engine = engine

    def require(self) -> tuple[ModelBundle, Engine]:
        """(bundle, engine), or a 503 "Loading model" error while loading."""
        engine = self.engine
        if engine is None and self.embedder is not None:   # --embedding: llama-server computes no completions
            raise not_supported("This server is embedding-only (started with --embedding or --reranking): it "
                                "serves /embeddings, /v1/embeddings and /rerank, not this endpoint. Start it "
                                "without --embedding")
        if engine is None or self.bundle is None:
            raise loading_error()
        return self.bundle, engine

    def tokenizer(self):
        """The served model's tokenizer, the engine's or an embedding server's (the routes that
        need only a tokenizer answer on both); 503 "Loading model" before either is loaded."""
        if self.engine is not None and self.bundle is not None:
            return self.bundle.tokenizer
        if self.embedder is not None:
            return self.embedder.embedder.tokenizer
        raise loading_error()

    def lab(self):
        """The engine's lab (live layouts/kernels), or None while loading or if the engine has none."""
        return getattr(self.engine, "lab", None) if self.engine is not None else None

    def _stats(self):
        return self.engine.stats() if self.engine is not None else None

    def remember_prompt(self, request_id: int, text: str) -> None:
        if self.config.slots_debug:
            self.prompts[request_id] = text

    def forget_prompt(self, request_id: int) -> None:
        self.prompts.pop(request_id, None)
