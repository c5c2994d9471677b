"""top_k rows in one native pass: logit_bias -> top_k -> top_p -> min_p -> temperature -> draw.

`truncated_tokens(logits, params, rngs, scratch)` -> the token of every row, or None where this path
does not apply (the caller then runs the batched sampler, which draws the same tokens). It applies
when every row is on the plain chain (sampler.py), reports no probabilities, and is greedy or
truncated by a top_k of at most MAX_K (llama-server's default chain: top_k 40, top_p 0.95, min_p
0.05, temperature 0.8 — what nearly every request runs); logit_bias and the repeat, frequency and
presence penalties are applied in the same pass (penalties.py's arithmetic, in float32).

Same tokens as `Sampler.sample`'s batched path: per row the top_k largest biased, penalized logits,
then row.py's keep_length and draw in C doubles in row.py's order, at the row's uniform drawn here
in row order from its own SequenceRng exactly as the batched path draws it (greedy rows draw none;
no row draws if any row fails). Tied logits keep the lower id first (a stable sort), and the
batched path draws from the same candidates (`top_rows`), so a seeded row draws alike on either
path, whatever else is in its batch (where a neighbour needs more than MAX_K candidates the batched
path takes torch's top-k, re-sorted in the same order: only a tie straddling the width could differ). One difference remains, changing a token only at a near-tie
(tests/test_sampling.py compares the two paths over seeded draws, half of them on bfloat16-rounded
logits full of ties): the top_p normaliser's sum in long double where row.py calls math.fsum
(within an ulp).

Why: the batched path is ~10 torch calls on [batch, vocab] (a copy, the bias, block maxima, topk,
gathers) then ~20-40 us of Python per row: 1.9 ms a step at 32 rows of a 49152 vocabulary, 3.3 ms at
64 (2-core AVX2 host). Here a row is one scan of its logits (8 at a time against the current k-th
best), the rows split over the torch threads: 0.6 / 1.2 ms (playground/sampler_bench.py; through
HTTP: docs/performance.md, "Host sampler in one native pass").
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import torch

from slotserver.runtime import native
from slotserver.model.sampling.penalties import History, _window, check_bias_tokens
from slotserver.model.sampling.params import SamplingError, SamplingParams

MAX_K = 256   # truncated.c's MAX_K: the largest top_k served here (a stack array of candidates a row)
_I64_NONE, _F32_NONE = torch.empty(0, dtype=torch.int64), torch.empty(0)   # no bias, no penalized token

_C_FILE = Path(__file__).with_name("truncated.c")
NATIVE_C = _C_FILE.read_text()
_LIB = native.build("sample_truncated", NATIVE_C, origin=str(_C_FILE))
native.signature(_LIB, "select_rows", 14, 4)
native.signature(_LIB, "draw_rows", 8, 1)


def _served(p: SamplingParams, vocab: int) -> bool:
    """A row this path draws: the plain chain, no probabilities; greedy or top_k in [1, MAX_K]."""
    closed = p.greedy or 0 < p.top_k <= MAX_K and p.top_k < vocab
    return closed and p.plain_chain and not p.post_sampling_probs and not p.n_probs


def _biases(params: Sequence[SamplingParams], vocab: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Each row's logit_bias, ragged -> (offsets [batch + 1], ids, values); applied in turn by the C."""
    offsets, ids, vals = [0], [], []
    for p in params:
        for t, v in p.logit_bias:
            ids.append(t)
            vals.append(v)
        offsets.append(len(ids))
    check_bias_tokens(ids, vocab)   # the C writes scratch rows at these ids
    return torch.tensor(offsets), torch.tensor(ids, dtype=torch.int64), torch.tensor(vals, dtype=torch.float32)


def _penalties(params: Sequence[SamplingParams], history: History, vocab: int):
    """Each row's penalized tokens and counts in its window (penalties.py's), ragged -> (offsets,
    ids, counts, [rep, freq, pres] a row) as tensors; SamplingError for a token outside the vocabulary."""
    pen = [(p.repeat_penalty, p.frequency_penalty, p.presence_penalty) for p in params]
    if not any(p.penalties_active for p in params):   # the default: no window counted
        return torch.zeros(len(params) + 1, dtype=torch.int64), _I64_NONE, _I64_NONE, torch.tensor(pen, dtype=torch.float32)
    offsets, ids, counts = [0], [], []
    for p, h in zip(params, history):
        seen = Counter(_window(p, h))
        ids += seen.keys()
        counts += seen.values()
        offsets.append(len(ids))
    if ids and not 0 <= min(ids) <= max(ids) < vocab:
        raise SamplingError(f"history contains token ids outside the vocabulary [0, {vocab})")
    return (torch.tensor(offsets), torch.tensor(ids, dtype=torch.int64), torch.tensor(counts, dtype=torch.int64),
            torch.tensor(pen, dtype=torch.float32))


def truncated_tokens(logits: torch.Tensor, params: Sequence[SamplingParams], rngs: Sequence,
                     scratch: torch.Tensor, history: History | None = None) -> torch.Tensor | None:
    """logits [batch, vocab] float32 CPU, unit last stride -> int64 tokens [batch], or None (not this
    path). scratch: a contiguous float32 CPU buffer of at least [batch, vocab] (the Sampler's).
    history: each row's tokens so far, for its penalties (None: no row may penalize)."""
    batch, vocab = logits.shape
    if _LIB is None or logits.dtype != torch.float32 or logits.stride(1) != 1 or not logits.is_cpu \
            or scratch.dtype != torch.float32 or not scratch.is_contiguous() or scratch.numel() < batch * vocab:
        return None
    if not all(_served(p, vocab) for p in params) or history is None and any(p.penalties_active for p in params):
        return None
    bias = _biases(params, vocab)
    pen = _penalties(params, history or (), vocab)
    temp = torch.tensor([p.temperature for p in params], dtype=torch.float64)
    cv, ci, n, bad = _select(logits, scratch, bias, pen, torch.tensor([p.top_k for p in params]), temp)
    if bad >= 0:   # before any draw, as the batched path (engine/step_sampling.py retries row by row)
        raise SamplingError(f"row {bad}: logits are NaN/inf, or logit_bias or a grammar forbids every token")
    f64 = torch.float64
    u = torch.tensor([0.0 if p.greedy else r.next_uniform() for p, r in zip(params, rngs)], dtype=f64)
    top_p, min_p = torch.tensor([p.top_p for p in params], dtype=f64), torch.tensor([p.min_p for p in params], dtype=f64)
    tokens = torch.empty(batch, dtype=torch.int64)
    _LIB.draw_rows(cv.data_ptr(), ci.data_ptr(), n.data_ptr(), top_p.data_ptr(), min_p.data_ptr(), temp.data_ptr(),
                   u.data_ptr(), tokens.data_ptr(), batch)
    return tokens


def top_rows(adj: torch.Tensor, width: int) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The `width` largest values of each row of adjusted logits adj [batch, vocab] float32 (bias
    and penalties already in), descending, the lower id first on ties, as `truncated_tokens` picks
    its candidates: [batch, width] values (-inf past a row's finite ones) and ids. The batched path
    draws from these, so a seeded row draws the same token on either path, ties included. None
    where this does not apply (no C, width over MAX_K, another dtype or layout)."""
    batch = adj.shape[0]
    if _LIB is None or width > MAX_K or adj.dtype != torch.float32 or not adj.is_cpu or adj.stride(1) != 1:
        return None
    none = (torch.zeros(batch + 1, dtype=torch.int64), _I64_NONE, _F32_NONE)   # no bias, no penalty
    cv, ci, _, _ = _select(adj, None, none, none[:2] + (_I64_NONE, _F32_NONE),
                           torch.full((batch,), width, dtype=torch.int64), torch.ones(batch, dtype=torch.float64))
    return cv[:, :width], ci[:, :width]


def _select(x: torch.Tensor, scratch: torch.Tensor | None, bias: tuple, pen: tuple, top_k: torch.Tensor,
            temp: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
    """truncated.c's select_rows over x [batch, vocab] -> (values [batch, MAX_K] (-inf past a row's
    count), ids, counts [batch], the first bad row or -1). scratch: rows to bias and penalize in
    (None where neither applies); bias: (offsets, ids, values); pen: (offsets, ids, counts, factors)."""
    batch, vocab = x.shape
    cv, ci = torch.full((batch, MAX_K), -math.inf), torch.zeros(batch, MAX_K, dtype=torch.int64)
    n = torch.empty(batch, dtype=torch.int64)
    bad = _LIB.select_rows(x.data_ptr(), 0 if scratch is None else scratch.data_ptr(),
                           *(t.data_ptr() for t in bias), *(t.data_ptr() for t in pen), top_k.data_ptr(),
                           temp.data_ptr(), cv.data_ptr(), ci.data_ptr(), n.data_ptr(), batch, vocab, x.stride(0),
                           torch.get_num_threads())
    return cv, ci, n, bad
