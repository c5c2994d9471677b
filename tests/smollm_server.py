"""An in-process server on the default model (SmolLM2-135M-Instruct), for tests whose answer must
mean something (valid JSON, a parsed tool call) rather than only have the right shape."""

from __future__ import annotations

import contextlib

import torch
from starlette.testclient import TestClient

from slotserver.engine.config import EngineConfig
from slotserver.engine.engine import Engine
from slotserver.model.bundle import ModelBundle
from slotserver.model.config import ModelConfig
from slotserver.model.default_model import default_model_path
from slotserver.server import ServerConfig, ServerState, create_app


@contextlib.contextmanager
def smollm_client(n_parallel: int = 4, ctx_size: int = 4096, dtype: str = "float32", **config):
    """(TestClient, engine) on the default model in float32 (the reference mode; dtype "auto": what
    `slotserver serve` runs)."""
    threads = torch.get_num_threads()
    bundle = ModelBundle.load(ModelConfig(default_model_path(), dtype=dtype, threads=min(threads, 2)))
    engine = Engine(bundle, EngineConfig(n_parallel=n_parallel, ctx_size=ctx_size)).start()
    state = ServerState(ServerConfig(model_path=str(bundle.config.model_path), **config))
    state.set_loaded(bundle, engine)
    try:
        with TestClient(create_app(state)) as client:
            yield client, engine
    finally:
        engine.stop()
        torch.set_num_threads(threads)
