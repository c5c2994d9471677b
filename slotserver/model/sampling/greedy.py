"""Greedy rows in one native pass: argmax of the logits after logit_bias, no probabilities asked.

`greedy_tokens(logits, params)` -> the token of every row, or None where this path does not apply
(the caller then runs the batched sampler, which computes the same tokens). It applies when every
row is greedy (temperature <= 0) on the plain chain, reports no probabilities, and has no penalty
active; logit_bias is allowed (`ignore_eos` is a -inf bias on the end-of-generation tokens, so
benchmark clients and llama.cpp's server tests take it). Same answer as `Sampler.sample`: the first
index of the largest biased logit; a row whose maximum is NaN or +-inf raises SamplingError.

Why: the batched sampler makes ~15 small torch ops per step whatever the batch (a copy, the bias's
index_put, block maxima, gathers, finiteness checks). On the CPU the rows are truncated.py's C pass
with a top_k of 1 (a copy into the row's scratch, the bias, one vectorized scan keeping the first
maximum, the rows over the torch threads): at 32 rows of a 49152 vocabulary 0.28 ms against 0.50
ms for the two-scan single-thread C it replaced (2-core AVX2 host, playground/sampler_bench.py).
On CUDA the argmax runs on the device and only the ids come back (`greedy_tokens_device`).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from slotserver.model.sampling.truncated import truncated_tokens
from slotserver.model.sampling.penalties import check_bias_tokens
from slotserver.model.sampling.params import SamplingError, SamplingParams
from slotserver.runtime.device import upload


NOT_FINITE = "logits are NaN/inf, or logit_bias or a grammar forbids every token"   # a row's error


def _plain_greedy(p: SamplingParams) -> bool:
    """A row both greedy paths serve: greedy on the plain chain, no probabilities, no penalty."""
    return p.greedy and p.plain_chain and not p.post_sampling_probs and not p.n_probs and not p.penalties_active


def greedy_tokens(logits: torch.Tensor, params: Sequence[SamplingParams], scratch: torch.Tensor) -> torch.Tensor | None:
    """logits [batch, vocab] float32 CPU, unit last stride -> int64 tokens [batch], or None (not this
    path). scratch: a contiguous float32 CPU buffer of at least [batch, vocab] (the Sampler's)."""
    if not all(_plain_greedy(p) for p in params):
        return None
    return truncated_tokens(logits, params, [None] * len(params), scratch)   # greedy rows draw nothing


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

