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
def smollm_client(n_parallel: int = 4, ctx_size: int = 4096, dtype: str = "float32", weights: str = "q", **config):
    """(TestClient, engine) on the default model: by default `serve`'s matmuls (the file's GGUF
    blocks) with float32 activations and a float32 K/V cache (serve keeps f16 K/V: dtype "auto"
    gives that); weights "auto" under float32 is the reference mode (exact dequantized weights).

    Why the blocks by default: the tests served here assert what an answer means (it parses, calls
    the tool, ends at EOS), not llama.cpp's floats, and the blocks decode a row ~4.6x faster on one
    core than the dequantized float32 weights."""
    threads = torch.get_num_threads()
    bundle = ModelBundle.load(ModelConfig(default_model_path(), dtype=dtype, weights=weights, threads=min(threads, 2)))
    engine = Engine(bundle, EngineConfig(n_parallel=n_parallel, ctx_size=ctx_size)).start()
    state = ServerState(ServerConfig(model_path=str(bundle.config.model_path), **config))
    state.set_loaded(bundle, engine)
    try:
        with TestClient(create_app(state)) as client:
            yield client, engine
    finally:
        engine.stop()
        torch.set_num_threads(threads)
