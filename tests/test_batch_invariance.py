"""A prompt's answer does not depend on how the server batched it.

Greedy text and reported probabilities are the same whether the prompt was evaluated in one
piece, in chunks, or with all but its last token served from the prompt cache: every attention
row is computed as its own one-query computation (kernels/attention.py), and the matmuls
quantize each activation row on its own. llama.cpp's CPU path has this property and its server
tests rely on it (same greedy text for a prompt given as tokens and as a cached string).
"""

from __future__ import annotations

import pytest
import torch

from slotserver.engine.kv_cache import KVCache
from slotserver.runtime.kv_spec import KVSpec
from slotserver.runtime.batch import Batch, SeqChunk
from slotserver.model.config import ModelConfig
from slotserver.model.default_model import default_model_path
from slotserver.model.model import LlamaModel
from smollm_server import smollm_client

PROMPT = [1, 339, 2783, 260, 3224, 282, 1029, 314, 700, 800, 900]


def _native_attention(model: LlamaModel) -> bool:
    return model.kernels.modules["attention"].module._LIB is not None


@pytest.fixture(scope="module", params=["auto", "q"])
def served(request):
    """The default model as `serve` runs it (dtype auto; GGUF blocks off AMX), and its blocks in
    float32 (`--dtype float32 --weights q`). The dense reference mode multiplies with torch's
    GEMM, whose blocking depends on the row count, and promises exactness, not this."""
    dtype, weights = ("auto", "auto") if request.param == "auto" else ("float32", "q")
    cfg = ModelConfig(default_model_path(), dtype=dtype, weights=weights)
    model = LlamaModel.load(cfg.model_path, cfg.torch_dtype, max_pos=256, fmt=cfg.weight_format)
    if not _native_attention(model):
        pytest.skip("no C compiler: attention runs on torch's SDPA, which is not batch-invariant")
    return model, cfg.torch_dtype


def _last_logits(model: LlamaModel, dtype, splits: list[int], prompt: bool, kv_dtype=None) -> torch.Tensor:
    """Logits of PROMPT's last token, the prompt fed in chunks that end at `splits` (as prompt
    rows, or as rows a decode step would compute)."""
    s = model.spec
    cache = KVCache.create("seq_head_dim", KVSpec(s.n_layers, 2, 64, s.n_kv_heads, s.head_dim, kv_dtype or dtype))
    start, out = 0, None
    for end in [*splits, len(PROMPT)]:
        out = model.forward(Batch.build([SeqChunk(1, start, PROMPT[start:end], prompt=prompt)]), cache)
        start = end
    return out[-1]


@pytest.mark.parametrize("prompt,kv", [(False, "model"), (False, "f16"), (True, "f16")],
                         ids=["decode-rows", "decode-rows-f16", "prompt-rows-f16"])
def test_last_prompt_token_gets_the_same_logits_however_the_prompt_was_chunked(served, prompt, kv):
    """Prompt rows (the AMX path on CPUs with AMX, over the f16 cache serve uses by default) and
    decode rows (the row kernel) each agree with themselves however the prompt is chunked."""
    model, dtype = served
    kv_dtype = torch.float16 if kv == "f16" else None
    whole = _last_logits(model, dtype, [], prompt, kv_dtype)
    for splits in ([10], [3, 6, 10], [1, 2, 3, 4, 5, 6, 7, 8, 9, 10], [5]):
        assert torch.equal(_last_logits(model, dtype, splits, prompt, kv_dtype), whole), splits


def test_cached_prompt_gives_the_same_greedy_text_and_probabilities():
    """Through HTTP, as `serve` runs: the second request finds all but one token in the slot's
    cache and evaluates one row; the first evaluated the whole prompt."""
    body = {"prompt": "I believe the meaning of life is", "temperature": 0, "n_predict": 24, "n_probs": 3}
    with smollm_client(n_parallel=1, dtype="auto") as (client, engine):
        if not _native_attention(engine.bundle.model):
            pytest.skip("no C compiler: attention runs on torch's SDPA, which is not batch-invariant")
        fresh = client.post("/completion", json=body | {"cache_prompt": False}).json()
        cached = client.post("/completion", json=body).json()
        again = client.post("/completion", json=body).json()
    assert cached["tokens_cached"] > 0 and fresh["content"]
    for r in (cached, again):
        assert r["content"] == fresh["content"]
        assert r["completion_probabilities"] == fresh["completion_probabilities"]
