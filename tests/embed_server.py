"""An embedding server in-process for tests: the tiny BERT fixture behind starlette's TestClient.

`embedding_client(pooling=..., rerank=...)` loads tests/fixtures/bert/tiny-bert.gguf as `serve
--embedding` would (Embedder + EmbedWorker published in the ServerState), runs the worker's loop on a
thread of its own, and yields a TestClient (also usable as the OpenAI SDK's `http_client`).
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from starlette.testclient import TestClient

from slotserver.model.config import ModelConfig
from slotserver.model.encoder.embedder import Embedder
from slotserver.server import ServerConfig, ServerState, create_app
from slotserver.server.embed_config import EmbeddingConfig
from slotserver.server.embed_worker import EmbedWorker

TINY_BERT = Path(__file__).parent / "fixtures" / "bert" / "tiny-bert.gguf"


def load_worker(pooling: str | None = None, rerank: bool = False, ubatch: int = 512,
                path: Path = TINY_BERT) -> EmbedWorker:
    config = EmbeddingConfig(pooling="rank" if rerank else pooling, rerank=rerank, ubatch=ubatch)
    return EmbedWorker(Embedder.load(ModelConfig(path, threads=1), config.pooling), config)


@contextmanager
def embedding_client(pooling: str | None = None, rerank: bool = False, ubatch: int = 512,
                     path: Path = TINY_BERT, **server) -> Iterator[TestClient]:
    worker = load_worker(pooling, rerank, ubatch, path)
    state = ServerState(ServerConfig(model_path=str(path), embedding=worker.config, **server))
    state.embedder = worker
    thread = threading.Thread(target=worker.run, name="test-embed-worker", daemon=True)
    thread.start()
    try:
        with TestClient(create_app(state)) as client:
            yield client
    finally:
        worker.stop()
        thread.join(10)
