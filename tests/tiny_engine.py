"""A started engine on the tiny model, for the HTTP tests' module fixtures."""

from __future__ import annotations

import contextlib
from pathlib import Path

import torch

from slotserver.engine.config import EngineConfig
from slotserver.engine.engine import Engine
from slotserver.model.bundle import ModelBundle
from slotserver.model.config import ModelConfig
from tiny_gguf import write_tiny_gguf


@contextlib.contextmanager
def running_tiny_engine(folder: Path, n_parallel: int, ctx_size: int, **metadata):
    """(bundle, engine) on a tiny GGUF written into `folder`; one torch thread (tiny ops only lose
    from threading), the caller's thread count restored afterwards."""
    threads = torch.get_num_threads()
    bundle = ModelBundle.load(ModelConfig(write_tiny_gguf(folder / "tiny.gguf", **metadata), threads=1))
    engine = Engine(bundle, EngineConfig(n_parallel=n_parallel, ctx_size=ctx_size)).start()
    try:
        yield bundle, engine
    finally:
        engine.stop()
        torch.set_num_threads(threads)
