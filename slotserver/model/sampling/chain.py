"""llama.cpp's full sampler chain for one row: every sampler, in the request's `samplers` order.

The batched fast path in sampler.py covers the common chain (penalties, top_k, top_p, min_p,
temperature). A row that turns on anything else (typical_p, DRY, XTC, top_n_sigma, dynamic
temperature, min_keep, mirostat, adaptive-p, a custom order) or asks for post-sampling
probabilities runs here instead: one sort of its vocabulary, then each sampler as in
src/llama-sampler.cpp on the candidates (ids and logits, kept sorted by logit, descending).
Keeping them sorted changes no sampler's kept set, only the order llama.cpp happens to leave them
in, which the final draw's distribution does not depend on.

All randomness (XTC's coin, the final draw) comes from the row's own SequenceRng, and mirostat's mu
and adaptive-p's average live in its `SamplerState`, so a seed reproduces a sequence whatever
else is in the batch.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from slotserver.model.sampling.dry import dry_penalties
from slotserver.model.sampling.final import ChainResult, SamplerState, adaptive_p, dist, mirostat_v1, mirostat_v2
from slotserver.model.sampling.infill import InfillVocab, infill
from slotserver.model.sampling.penalties import apply_penalties_
from slotserver.model.sampling.params import SamplingError, SamplingParams

__all__ = ["ChainResult", "SamplerState", "Candidates", "run_chain"]

NEG_INF = -math.inf


@dataclass
class Candidates:
    """A row's surviving tokens: llama_token_data_array. Sorted by logit, descending, once a sampler
    needs the order (`sort`); elementwise samplers (penalties, DRY, top_n_sigma) and top_k's
    partial selection run on the unsorted vocabulary, so the default chain never sorts all of it."""

    ids: torch.Tensor  # [n] int64
    logits: torch.Tensor  # [n] float32
    is_sorted: bool = True

    @classmethod
    def of(cls, ids: torch.Tensor, logits: torch.Tensor) -> Candidates:
        return cls(ids, logits, is_sorted=False)

    def sort(self) -> Candidates:
        if self.is_sorted:
            return self
        order = torch.sort(self.logits, descending=True, stable=True).indices
        return Candidates(self.ids[order], self.logits[order])

    def keep(self, n: int) -> Candidates:
        c = self.sort()
        return Candidates(c.ids[:n], c.logits[:n])

    def probs(self) -> torch.Tensor:
        return torch.softmax(self.logits, dim=0)  # [n]


def _penalties(c: Candidates, p: SamplingParams, history: Sequence[int], vocab: int) -> Candidates:
    if not p.penalties_active:
        return c
    row = torch.full((1, vocab), NEG_INF, dtype=torch.float32)
    row[0, c.ids] = c.logits
    apply_penalties_(row, [p], [history])
    return Candidates.of(c.ids, row[0, c.ids])


def _dry(c: Candidates, p: SamplingParams, history: Sequence[int]) -> Candidates:
    table = dry_penalties(history, p.dry_multiplier, p.dry_base, p.dry_allowed_length,
                          p.dry_penalty_last_n, p.dry_breakers)
    if not table:
        return c
    tokens = torch.tensor(list(table), dtype=torch.int64)
    amounts = torch.tensor(list(table.values()), dtype=torch.float32)
    match = c.ids[:, None] == tokens[None, :]  # [n, m]
    delta = (match.to(torch.float32) * amounts[None, :]).sum(dim=1)  # [n]
    return Candidates.of(c.ids, c.logits - delta)


def top_n_sigma(c: Candidates, n: float) -> Candidates:
    """Mask (to -inf, keeping the size) logits below max - n * std of the finite logits."""
    if n <= 0 or c.ids.numel() <= 1:
        return c
    finite = c.logits[c.logits != NEG_INF].double()
    if finite.numel() == 0:
        return c
    std = float(((finite - finite.mean()) ** 2).mean().sqrt())
    floor = float(finite.max()) - n * std
    return Candidates(c.ids, c.logits.masked_fill(c.logits < floor, NEG_INF), c.is_sorted)


def top_k(c: Candidates, k: int) -> Candidates:
    if k <= 0:
        return c
    if c.is_sorted or k >= c.ids.numel():
        return c.keep(k)
    vals, pos = torch.topk(c.logits, k)  # descending; ties by position, like the stable sort
    return Candidates(c.ids[pos], vals)


def typical(c: Candidates, p: float, min_keep: int) -> Candidates:
    """Keep the tokens whose surprise is closest to the entropy, until their mass exceeds p."""
    if p >= 1:
        return c
    probs = c.probs().double()
    logp = probs.log()
    entropy = float(-(probs * logp).nan_to_num(0.0).sum())
    order = torch.sort((-logp - entropy).abs(), stable=True).indices
    cum = probs[order].cumsum(0)
    idx = torch.arange(cum.numel())
    ok = (cum > p) & ((min_keep == 0) | (idx >= min_keep - 1))
    last = int(ok.nonzero()[0]) + 1 if bool(ok.any()) else cum.numel()
    chosen = order[:last]
    return Candidates.of(c.ids[chosen], c.logits[chosen])


def top_p(c: Candidates, p: float, min_keep: int) -> Candidates:
    if p >= 1:
        return c
    c = c.sort()
    cum = c.probs().cumsum(0)
    ok = (cum >= p) & (torch.arange(cum.numel()) + 1 >= min_keep)
    return c.keep(int(ok.nonzero()[0]) + 1) if bool(ok.any()) else c


def min_p(c: Candidates, p: float, min_keep: int) -> Candidates:
    if p <= 0 or c.ids.numel() == 0:
        return c
    c = c.sort()
    above = int((c.logits >= c.logits[0] + math.log(p)).sum())
    return c.keep(max(above, min_keep, 1))


def xtc(c: Candidates, probability: float, threshold: float, min_keep: int, uniform) -> Candidates:
    """With chance `probability`, drop every token at or above `threshold` except the least likely of them."""
    if probability <= 0 or threshold > 0.5 or c.ids.numel() < 2:
        return c
    if uniform() > probability:
        return c
    c = c.sort()
    above = c.probs() >= threshold
    pos_last = max(int(above.to(torch.int64).cumprod(0).sum()) - 1, 0)  # last index of the leading run
    if c.ids.numel() - pos_last >= min_keep and pos_last > 0:
        return Candidates(c.ids[pos_last:], c.logits[pos_last:])
    return c


def temperature(c: Candidates, temp: float) -> Candidates:
    """llama_sampler_temp_impl: <= 0 keeps only the largest logit (the others -inf)."""
    if c.ids.numel() == 0:
        return c
    if temp <= 0:
        c = c.sort()
        return Candidates(c.ids, torch.cat([c.logits[:1], torch.full_like(c.logits[1:], NEG_INF)]))
    return Candidates(c.ids, c.logits / temp, c.is_sorted)


def temperature_ext(c: Candidates, temp: float, delta: float, exponent: float) -> Candidates:
    """Dynamic temperature: the candidates' entropy, normalised by its maximum log(n), mapped to
    [max(0, temp - delta), temp + delta] through x ** exponent."""
    if delta <= 0:
        return temperature(c, temp)
    if c.ids.numel() <= 1:
        return c
    lo, hi = max(0.0, temp - delta), temp + delta
    probs = c.probs().double()
    entropy = float(-(probs * probs.log()).nan_to_num(0.0).sum())
    normalised = entropy / math.log(c.ids.numel())
    return temperature(c, lo + (hi - lo) * normalised**exponent)


def _infill(c: Candidates, vocab: InfillVocab | None) -> Candidates:
    if vocab is None:
        raise SamplingError("the infill sampler needs the model's vocabulary, which this sampler was not given")
    c = c.sort()
    return Candidates(*infill(c.ids, c.logits, vocab))


def _apply(name: str, c: Candidates, p: SamplingParams, history: Sequence[int], vocab: int, uniform,
           fim: InfillVocab | None) -> Candidates:
    if name == "infill":
        return _infill(c, fim)
    if name == "penalties":
        return _penalties(c, p, history, vocab)
    if name == "dry":
        return _dry(c, p, history)
    if name == "top_n_sigma":
        return top_n_sigma(c, p.top_n_sigma)
    if name == "top_k":
        return top_k(c, p.top_k)
    if name == "typ_p":
        return typical(c, p.typical_p, p.min_keep)
    if name == "top_p":
        return top_p(c, p.top_p, p.min_keep)
    if name == "min_p":
        return min_p(c, p.min_p, p.min_keep)
    if name == "xtc":
        return xtc(c, p.xtc_probability, p.xtc_threshold, p.min_keep, uniform)
    if name == "temperature":
        return temperature_ext(c, p.temperature, p.dynatemp_range, p.dynatemp_exponent)
    return c  # adaptive_p: the final draw, see run_chain


def run_chain(logits: torch.Tensor, p: SamplingParams, rng, history: Sequence[int],
              fim: InfillVocab | None = None) -> ChainResult:
    """logits [vocab] float32 (after logit_bias, which heads every llama.cpp chain) -> the token and
    the final distribution. `rng` is the row's SequenceRng; its `state` carries mirostat's mu.
    `fim`: what the infill sampler reads of the vocabulary (a chain naming it fails without)."""
    vocab = logits.shape[0]
    c = Candidates.of(torch.arange(vocab), logits.detach().to("cpu", torch.float32))
    state: SamplerState = rng.state
    if p.mirostat:
        c = temperature(c, p.temperature).sort()
        keep = c.logits != NEG_INF  # p = 0 tokens: no surprise to estimate from
        c = Candidates(c.ids[keep], c.logits[keep])
        if p.mirostat == 1:
            return mirostat_v1(c.ids, c.logits, p, state, rng.next_uniform(), vocab)
        return mirostat_v2(c.ids, c.logits, p, state, rng.next_uniform())
    for name in p.samplers:
        c = _apply(name, c, p, history, vocab, rng.next_uniform, fim)
    if "adaptive_p" in p.samplers:
        return adaptive_p(c.ids, c.logits, p, state, rng.next_uniform())
    return dist(c.ids, c.logits, rng.next_uniform())
