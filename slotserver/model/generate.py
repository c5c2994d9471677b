"""Batch generation straight on the model: used by `slotserver generate` and as the tests' oracle.

All requests are prefilled together in one ragged forward, then decoded together, one forward per
step, each on its own KV stream. This is the simplest correct driver of `LlamaModel`; the slot
engine (scheduler, continuous batching, prompt cache) drives the same model for serving.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from slotserver.runtime.batch import Batch, SeqChunk
from slotserver.runtime.kv_spec import KVSpec
from slotserver.runtime.layouts import create_layout, load_layout
from slotserver.model.config import DEFAULT_LAYOUT
from slotserver.model.model import LlamaModel
from slotserver.model.sampling.sampler import Sampler, SequenceRng
from slotserver.model.sampling.params import SamplingParams, ignore_eos_params


@dataclass
class GenRequest:
    prompt_ids: list[int]
    n_predict: int = 32
    params: SamplingParams = field(default_factory=lambda: SamplingParams(temperature=0.0))
    ignore_eos: bool = False
    lora: tuple[float, ...] = ()   # each LoRA adapter's scale (model/lora.py; the model's adapters)


@dataclass
class GenResult:
    tokens: list[int] = field(default_factory=list)
    stop_reason: str = ""          # "eos" | "limit"
    top: list[list[tuple[int, float]]] = field(default_factory=list)  # n_probs per position


OnToken = Callable[[int, int], None]  # (request index, token id)


def generate(model: LlamaModel, requests: list[GenRequest], eog_ids: frozenset[int],
             on_token: OnToken | None = None, layout: str = DEFAULT_LAYOUT,
             layouts_dir=None, make_cache: Callable[[KVSpec], object] | None = None) -> list[GenResult]:
    """Generate for every request at once; returns one `GenResult` per request, in order.
    make_cache: builds the KV cache of a spec (default: the layout named; --tp: slotserver/parallel)."""
    s = model.spec
    n_cells = max(len(r.prompt_ids) + r.n_predict for r in requests)
    assert all(r.prompt_ids for r in requests), "empty prompt"
    assert n_cells <= model.rope.max_pos, "prompt + n_predict longer than the model's context"
    spec = KVSpec(s.n_kv_layers, len(requests), n_cells, s.n_kv_heads, s.head_dim, model.dtype, device=model.device)
    cache = make_cache(spec) if make_cache else create_layout(load_layout(layout, layouts_dir), spec)
    params = [ignore_eos_params(r.params, eog_ids) if r.ignore_eos else r.params for r in requests]
    rngs = [SequenceRng(p.seed) for p in params]
    history = [list(r.prompt_ids) for r in requests]
    results = [GenResult() for _ in requests]
    sampler = Sampler(s.vocab_size)
    chunks = [SeqChunk(i, 0, list(r.prompt_ids), prompt=True, lora=r.lora) for i, r in enumerate(requests)]
    active = [i for i, r in enumerate(requests) if r.n_predict > 0]
    chunks = [chunks[i] for i in active]
    while active:
        logits = model.forward(Batch.build(chunks, model.device), cache).cpu()   # [len(active), vocab], sampled on the host
        out = sampler.sample(logits, [params[i] for i in active], [rngs[i] for i in active],
                             [history[i] for i in active])
        still = []
        for row, i in enumerate(active):
            token = int(out.tokens[row])
            _record(results[i], out, row, token, params[i].n_probs)
            history[i].append(token)
            if on_token:
                on_token(i, token)
            if token in eog_ids and not requests[i].ignore_eos:
                results[i].stop_reason = "eos"
            elif len(results[i].tokens) >= requests[i].n_predict:
                results[i].stop_reason = "limit"
            else:
                still.append(i)
        active = still
        chunks = [SeqChunk(i, len(history[i]) - 1, [history[i][-1]], lora=requests[i].lora) for i in active]
    return results


def _record(result: GenResult, out, row: int, token: int, n_probs: int) -> None:
    result.tokens.append(token)
    if n_probs and out.top_ids is not None:
        ids = out.top_ids[row, :n_probs].tolist()
        lps = out.top_logprobs[row, :n_probs].tolist()
        result.top.append(list(zip(ids, lps)))
