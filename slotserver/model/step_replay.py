"""How a forward's step runs once `LlamaModel._forward` has let it through: replayed from a
captured graph where one serves it, else the layers as usual (`LlamaModel._body`).

- **CPU**: the C step graphs (step_graph.py) serve decode-only batches of up to `max_rows` rows,
  keyed on (rows, contiguous streams, threads) and, for a batch with LoRA rows, their C deltas. A
  hybrid model's capture runs the step more than once, so the batch's recurrent states are saved
  first and put back before each later run (`RecurrentState.rewinder`); a batch whose states would
  pass REWIND_BYTES_MAX runs as usual.
- **CUDA**: CUDA graphs (cuda_graph.py) per (rows, KV bucket). A CUDA capture runs nothing (the
  eager step before it is the real one), so a hybrid's decode steps need no rewind: its kernels take
  the streams from device tensors and update the states in place; the graphs' owner holds the
  states' addresses. A paged layout serves through its `graph_step`; MoE models run eagerly.

What may not replay at all (mistral3's q temperature past its trained context, LoRA rows with
torch's deltas) never reaches this module.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

import torch

from slotserver.model.cuda_graph import CudaGraphs
from slotserver.model.step_graph import GRAPH_BYTES_MIN, StepGraphs
from slotserver.runtime.batch import Batch

if TYPE_CHECKING:
    from slotserver.model.model import LlamaModel


def new_graphs(model: "LlamaModel") -> StepGraphs | CudaGraphs:
    """On CUDA, CUDA graphs; on the CPU, the C step graphs, whose buffers may take a quarter of the
    weights' bytes (at least GRAPH_BYTES_MIN)."""
    if model.device == "cuda":
        return CudaGraphs()
    weights = sum(m.nbytes() for m in model.weights.matmuls())
    return StepGraphs(budget=max(GRAPH_BYTES_MIN, weights // 4))


def replayed(model: "LlamaModel", batch: Batch, cache, logits_into: torch.Tensor | None) -> torch.Tensor:
    """The step's logits: from a graph (replayed, or captured now) where one serves it, else as usual."""
    if isinstance(model.graphs, CudaGraphs):
        return _cuda(model, batch, cache, logits_into)
    x, angles = model._inputs(batch)
    key = _cpu_key(model, batch)
    if key is None:
        return model._body(x, angles, batch, cache, logits_into)
    state = getattr(cache, "recurrent", None)   # a hybrid's states: the graph holds their pointers
    if state is not None and not state.rewinds(batch.attn.n_seqs):
        return model._body(x, angles, batch, cache, logits_into)   # a capture would copy too much state
    inputs = [x, *(t for pair in angles.values() for t in pair), *batch.tensors()]
    rewind = None if state is None else lambda: state.rewinder([h[0] for h in batch.attn.host])
    return model.graphs.run((model.kernels, getattr(cache, "layout", cache), model.lora, state), key, inputs,
                            lambda: model._body(x, angles, batch, cache), model.kernels.timings,
                            None if logits_into is None else logits_into[: batch.n_tokens], rewind)


def _cpu_key(model: "LlamaModel", batch: Batch) -> tuple | None:
    """A decode-only batch (every row one token, logits for each, no prompt rows) of up to max_rows
    rows on the CPU -> its graph's key; else None."""
    meta, n = batch.attn, batch.n_tokens
    if model.graphs is None or n > model.graphs.max_rows or meta.max_q != 1 or meta.split is not None \
            or meta.row_prompt is not None \
            or batch.logits_rows.shape[0] != n or not batch.tokens.is_cpu:
        return None
    key = (n, meta.stream_base is not None, torch.get_num_threads())
    return key + ("lora",) if model._adapted(batch) else key   # LoRA rows: C deltas a graph of its own records


def _cuda(model: "LlamaModel", batch: Batch, cache, logits_into: torch.Tensor | None) -> torch.Tensor:
    """A decode step replayed from a CUDA graph where one serves it, else eager. A paged layout
    serves when it offers `graph_step` (runtime/paged_cache.py): the step's cells are placed on the
    host first, into buffers the graph reads."""
    layout = getattr(cache, "layout", cache)
    paged = cache.view(0).paged
    step = getattr(layout, "graph_step", None) if paged else None
    key = None if model.spec.moe is not None else model.graphs.key(batch, paged and step is None)  # MoE: eager
    if key is None:
        return model._body(*model._inputs(batch), batch, cache, logits_into)
    with step(batch.token_streams, batch.positions) if step else contextlib.nullcontext():
        view = cache.view(0)   # again: graph_step may have grown (moved) a paged pool
        storage = view.k_pages if view.paged else view.k
        state = getattr(cache, "recurrent", None)   # a hybrid's states: the graph holds their addresses
        owner = (model.kernels, layout, model.weights, storage.data_ptr(),   # a paged pool's growth moves it
                 *(() if state is None else (state, state.conv.data_ptr(), state.ssm.data_ptr())))
        return model.graphs.run(owner, key, batch, lambda b: model._body(*model._inputs(b), b, cache))
