"""Helpers for the KV-shift tests (tests/test_context_shift.py, tests/test_cache_reuse.py).

Why one-layer models: a KV shift keeps the kept tokens' K/V as they were computed, with the
discarded tokens in their context (llama.cpp does the same). In a one-layer model a token's K/V
depend only on the token and its position, so there a shift must give exactly what a fresh prefill
of the kept tokens at their new positions gives: the strongest check of the move and the
re-rotation. Deeper models are checked on the rotation itself (test_context_shift.py).

VARIANTS are one-layer tiny models with each RoPE form the package loads (the switches of
playground/make_arch_fixtures.py's cases): GGML normal pairs, NEOX (qwen2) with yarn scaling and
partial rotary dims, llama3 frequency factors, linear scaling, phi3 longrope (long factors: the
context passes the trained one), gemma3's windowed layer with its own rope base and q/k norms.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from gguf import GGUFValueType
from tiny_gguf import write_tiny_gguf

from slotserver.engine.config import EngineConfig
from slotserver.engine.engine import Engine
from slotserver.engine.kv_cache import KVCache
from slotserver.engine.request import FinalEvent, TokenEvent
from slotserver.model.bundle import ModelBundle
from slotserver.model.config import ModelConfig
from slotserver.model.model import LlamaModel
from slotserver.runtime.batch import Batch, SeqChunk
from slotserver.runtime.kv_spec import KVSpec
from slotserver.runtime.layouts import available_layouts

U32 = GGUFValueType.UINT32
MAX_POS = 256
FLOAT_LAYOUTS = [name for name in available_layouts() if name != "q8"]   # q8 re-quantizes: its own bound
SMALL = dict(n_layers=1, d_model=32, n_heads=4, n_kv_heads=2, d_ff=64, ctx_len=512)
VARIANTS: dict[str, dict] = {
    "llama": dict(arch="llama"),
    "qwen2_yarn_partial": dict(arch="qwen2", qkv_bias=True, **{
        "qwen2.rope.scaling.type": "yarn", "qwen2.rope.scaling.factor": 4.0,
        "qwen2.rope.scaling.original_context_length": (64, U32), "qwen2.rope.dimension_count": 4}),
    "llama3_freqs": dict(arch="llama", features=("rope_freqs",), rope_base=500000.0),
    "llama_linear": dict(arch="llama", **{"llama.rope.scaling.type": "linear", "llama.rope.scaling.factor": 2.0}),
    "phi3_longrope": dict(arch="phi3", n_kv_heads=4, features=("fused", "rope_factors"), **{
        "phi3.rope.scaling.attn_factor": 1.2, "phi3.rope.scaling.original_context_length": (128, U32)}),
    "gemma3_window": dict(arch="gemma3", head_dim=16, rope_base=1e6, features=("qk_norm", "post_norms"), **{
        "gemma3.attention.sliding_window": (4, U32), "gemma3.final_logit_softcapping": 8.0}),
}


@pytest.fixture(autouse=True)
def one_torch_thread():
    """Tiny models only lose from threads (as tests/tiny_engine.py); the caller's count comes back."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def write_variant(folder: Path, name: str, **extra) -> Path:
    """The tiny GGUF of a variant (seeded by its name), written once per folder."""
    path = folder / f"{name}.gguf"
    if not path.exists():
        write_tiny_gguf(path, seed=sum(map(ord, name)), **(SMALL | VARIANTS[name] | extra))
    return path


def load_model(path: Path) -> LlamaModel:
    return LlamaModel.load(path, torch.float32, max_pos=MAX_POS)


def new_cache(model: LlamaModel, layout: str, n_streams: int = 2, n_cells: int = 96) -> KVCache:
    s = model.spec
    return KVCache.create(layout, KVSpec(s.n_layers, n_streams, n_cells, s.n_kv_heads, s.head_dim, torch.float32))


def prefill(model: LlamaModel, cache: KVCache, stream: int, start: int, tokens: list[int]) -> torch.Tensor:
    """Run `tokens` from cell `start` of `stream`; -> the last token's logits [vocab]."""
    return model.forward(Batch.build([SeqChunk(stream, start, tokens)]), cache)[0]


def fresh_logits(model: LlamaModel, layout: str, tokens: list[int]) -> torch.Tensor:
    """The reference: `tokens` prefilled from cell 0 on a new cache; -> the last token's logits."""
    return prefill(model, new_cache(model, layout), 1, 0, tokens)


def engine(path: Path, layout: str = "seq_head_dim", **config) -> Engine:
    """A float32 engine (float32 KV) on the model at `path`, driven with `run` on this thread (one
    torch thread: `one_torch_thread` restores the count)."""
    bundle = ModelBundle.load(ModelConfig(model_path=path, layout=layout, threads=1))
    return Engine(bundle, EngineConfig(**config))


def events(handle) -> tuple[list[int], list[float], object]:
    """(tokens, their log-probabilities, final event) of a finished request."""
    tokens, logprobs, final = [], [], None
    for ev in handle.iter_events(timeout=0):
        if isinstance(ev, TokenEvent):
            tokens.append(ev.token)
            logprobs.append(ev.logprob)
        elif isinstance(ev, FinalEvent):
            final = ev
    return tokens, logprobs, final


def run(engine: Engine, max_steps: int = 5000) -> None:
    """Step the engine until it has nothing to do."""
    for _ in range(max_steps):
        if not engine.step():
            return
    raise AssertionError("the engine did not finish")
