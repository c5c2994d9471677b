"""Greedy rows in one native pass: argmax of the logits after logit_bias, no probabilities asked.

`greedy_tokens(logits, params)` -> the token of every row, or None where this path does not apply
(the caller then runs the batched sampler, which computes the same tokens). It applies when every
row is greedy (temperature <= 0) on the plain chain, reports no probabilities, and has no penalty
active; logit_bias is allowed (`ignore_eos` is a -inf bias on the end-of-generation tokens, so
benchmark clients and llama.cpp's server tests take it). Same answer as `Sampler.sample`: the first
index of the largest biased logit; a row whose maximum is NaN or +-inf raises SamplingError.

Why: the batched sampler makes ~15 small torch ops per step whatever the batch (a copy, the bias's
index_put, block maxima, gathers, finiteness checks): right after a forward at batch 1, ~0.37 ms
against ~0.13 ms here (~0.03 ms with the logits warm); one C call per step: per row a copy into the
sampler's scratch row, the bias, a vectorized max, a scan for its first index.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch

from slotserver.runtime import native
from slotserver.model.sampling.penalties import check_bias_tokens
from slotserver.model.sampling.params import SamplingError, SamplingParams
from slotserver.runtime.device import upload

# The C (greedy.c beside this file; not hot-reloaded: read once at import).
_C_FILE = Path(__file__).with_name("greedy.c")
NATIVE_C = _C_FILE.read_text()
_LIB = native.build("sample_greedy", NATIVE_C, origin=str(_C_FILE))
native.signature(_LIB, "greedy_rows", 6, 3)


NOT_FINITE = "logits are NaN/inf, or logit_bias or a grammar forbids every token"   # a row's error


def _plain_greedy(p: SamplingParams) -> bool:
    """A row both greedy paths serve: greedy on the plain chain, no probabilities, no penalty."""
    return p.greedy and p.plain_chain and not p.post_sampling_probs and not p.n_probs and not p.penalties_active


def greedy_tokens(logits: torch.Tensor, params: Sequence[SamplingParams], scratch: torch.Tensor) -> torch.Tensor | None:
    """logits [batch, vocab] float32 CPU, unit last stride -> int64 tokens [batch], or None (not this
    path). scratch: a contiguous float32 CPU buffer of at least vocab elements (the Sampler's)."""
    if _LIB is None or logits.dtype != torch.float32 or logits.stride(1) != 1 or not logits.is_cpu \
            or scratch.dtype != torch.float32 or not scratch.is_contiguous() or scratch.numel() < logits.shape[1]:
        return None
    offsets, ids, vals = [0], [], []
    for p in params:
        if not _plain_greedy(p):
            return None
        for t, v in p.logit_bias:
            ids.append(t)
            vals.append(v)
        offsets.append(len(ids))
    batch, vocab = logits.shape
    check_bias_tokens(ids, vocab)   # the C writes scratch[id]
    tokens = torch.empty(batch, dtype=torch.int64)
    o, i, v = torch.tensor(offsets), torch.tensor(ids, dtype=torch.int64), torch.tensor(vals, dtype=torch.float32)
    bad = _LIB.greedy_rows(logits.data_ptr(), scratch.data_ptr(), o.data_ptr(), i.data_ptr(), v.data_ptr(),
                           tokens.data_ptr(), batch, vocab, logits.stride(0))
    if bad >= 0:
        raise SamplingError(f"row {bad}: logits are NaN/inf, or logit_bias or a grammar forbids every token")
    return tokens


def greedy_tokens_device(logits: torch.Tensor, params: Sequence[SamplingParams]) -> torch.Tensor | None:
    """The same tokens as `greedy_tokens` from logits left on the GPU: the biased argmax runs there
    and only the ids (and a finiteness flag per row) come back, not `[batch, vocab]` floats (39 MB
    at batch 64 of a 151k vocabulary). None where this path does not apply (as `greedy_tokens`).
    torch's argmax returns the first index of the maximum, as the C does."""
    ids = greedy_ids_device(logits, params)
    if ids is None:
        return None
    out = ids.cpu()                                                # one copy back: ids and flags
    bad = (out[1] == 0).nonzero()
    if bad.numel():
        raise SamplingError(f"row {int(bad[0])}: {NOT_FINITE}")
    return out[0]


def greedy_ids_device(logits: torch.Tensor, params: Sequence[SamplingParams]) -> torch.Tensor | None:
    """`greedy_tokens_device` without waiting: int64 `[2, batch]` where the logits are (row 0 the
    tokens, row 1 1 where the row's maximum is finite, else 0), or None (not this path). Nothing here
    waits for the device (the bias goes up from pinned memory without a sync), so an overlapped
    engine step (engine/overlap.py) can launch the next forward before these ids reach the host."""
    rows, cols, vals = [], [], []
    for b, p in enumerate(params):
        if not _plain_greedy(p):
            return None
        for t, v in p.logit_bias:
            rows.append(b)
            cols.append(t)
            vals.append(v)
    check_bias_tokens(cols, logits.shape[1])
    adj = logits
    if cols:   # biases added in turn into a copy, as the C adds them into its scratch row
        adj = logits.float().clone()
        idx = upload(torch.tensor([rows, cols], dtype=torch.int64), logits.device)
        adj.index_put_((idx[0], idx[1]), upload(torch.tensor(vals, dtype=torch.float32), logits.device),
                       accumulate=True)
    best, token = adj.max(dim=1)                                   # [batch] each
    return torch.stack([token, best.isfinite().long()])            # [2, batch]

