"""The samplers that pick the token at the end of a llama.cpp chain: dist, mirostat 1 and 2, adaptive-p.

Mirostat and adaptive-p adapt across steps: their state (mu; the moving average of chosen tokens'
probabilities) belongs to one sequence and lives in its `SamplerState`, which hangs off the
sequence's SequenceRng, so it is created with the sequence and dies with it, as llama.cpp's
per-slot sampler chain does. Formulas follow src/llama-sampler.cpp; arithmetic is float64 where
llama.cpp uses float32.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from slotserver.model.sampling.params import SamplingParams

MIROSTAT_M = 100  # llama.cpp's common_sampler_init passes m = 100
INT_MIN = -(2**31)


@dataclass
class SamplerState:
    """Per-sequence state of the adaptive samplers; None until their first step."""

    mu: float | None = None  # mirostat: starts at 2 * tau
    ema_sum: float | None = None  # adaptive-p: sum of p_i * decay^i
    ema_weight: float | None = None  # adaptive-p: sum of decay^i


@dataclass
class ChainResult:
    """The chosen token and the chain's final distribution (what post_sampling_probs reports):
    candidates with p > 0, most probable first."""

    token: int
    ids: torch.Tensor  # [m] int64
    logprobs: torch.Tensor  # [m] float32


def _draw(probs: torch.Tensor, u: float) -> int:
    """llama_sample_dist: the first candidate whose running sum reaches u * total."""
    cdf = probs.double().cumsum(0)
    target = torch.tensor([u * float(cdf[-1])], dtype=torch.float64)
    return min(int(torch.searchsorted(cdf, target)), probs.numel() - 1)


def _result(ids: torch.Tensor, probs: torch.Tensor, idx: int) -> ChainResult:
    order = torch.sort(probs, descending=True, stable=True).indices
    order = order[probs[order] > 0]
    return ChainResult(int(ids[idx]), ids[order], probs[order].log().to(torch.float32))


def dist(ids: torch.Tensor, logits: torch.Tensor, u: float) -> ChainResult:
    probs = torch.softmax(logits.double(), dim=0)
    return _result(ids, probs, _draw(probs, u))


def _c_int(x: float) -> int:
    """C's (int) cast of a float on x86: NaN and out-of-range values give INT_MIN."""
    return int(x) if math.isfinite(x) and -(2**31) <= x < 2**31 else INT_MIN


def _powf(a: float, b: float) -> float:
    try:
        return math.pow(a, b)
    except ValueError:  # negative base, fractional exponent: NaN in C
        return math.nan
    except OverflowError:
        return math.inf


def mirostat_v1(ids, logits, p: SamplingParams, state: SamplerState, u: float, vocab: int) -> ChainResult:
    """Estimate the Zipf exponent s from the top M probabilities, pick k so the expected surprise
    is mu, sample from the top k, then mu -= eta * (observed surprise - tau)."""
    mu = 2 * p.mirostat_tau if state.mu is None else state.mu
    probs = torch.softmax(logits.double(), dim=0)
    n = min(MIROSTAT_M - 1, probs.numel() - 1)
    i = torch.arange(n, dtype=torch.float64)
    t = torch.log((i + 2) / (i + 1))
    b = torch.log(probs[:n] / probs[1 : n + 1])
    s_hat = float((t * b).sum()) / float((t * t).sum()) if n > 0 else math.nan
    eps = s_hat - 1
    k = _powf(eps * _powf(2.0, mu) / (1 - _powf(vocab, -eps)), 1 / s_hat) if s_hat else math.nan
    keep = min(max(_c_int(k), 1), probs.numel())
    probs = torch.softmax(logits[:keep].double(), dim=0)
    idx = _draw(probs, u)
    state.mu = mu - p.mirostat_eta * (-math.log2(float(probs[idx])) - p.mirostat_tau)
    return _result(ids[:keep], probs, idx)


def mirostat_v2(ids, logits, p: SamplingParams, state: SamplerState, u: float) -> ChainResult:
    """Keep the candidates whose surprise -log2(p) is at most mu (at least one), sample, update mu."""
    mu = 2 * p.mirostat_tau if state.mu is None else state.mu
    probs = torch.softmax(logits.double(), dim=0)
    over = (-torch.log2(probs) > mu).nonzero()
    keep = max(int(over[0]) if over.numel() else probs.numel(), 1)
    probs = torch.softmax(logits[:keep].double(), dim=0)
    idx = _draw(probs, u)
    state.mu = mu - p.mirostat_eta * (-math.log2(float(probs[idx])) - p.mirostat_tau)
    return _result(ids[:keep], probs, idx)


def adaptive_p(ids, logits, p: SamplingParams, state: SamplerState, u: float) -> ChainResult:
    """Reshape the candidates' probabilities around a target that an exponential moving average of
    the chosen tokens' original probabilities steers, then sample (llama.cpp PR 17927)."""
    probs = torch.softmax(logits.double(), dim=0)
    if p.adaptive_target < 0:
        return _result(ids, probs, _draw(probs, u))
    decay = p.adaptive_decay
    if state.ema_sum is None or state.ema_weight is None:
        state.ema_sum, state.ema_weight = p.adaptive_target / (1 - decay), 1 / (1 - decay)
    target = min(max(p.adaptive_target, 0.0), 1.0)
    adapted = target if state.ema_weight == 0 else 2 * target - state.ema_sum / state.ema_weight
    adapted = min(max(adapted, 0.0), 1.0)
    d = ((probs - adapted) / 0.3).abs()
    shaped = torch.where(logits == -math.inf, logits.double(), 5.0 - 10.0 * d * d / (1 + d))
    new = torch.softmax(shaped, dim=0)
    idx = _draw(new, u)
    state.ema_sum = float(probs[idx]) + decay * state.ema_sum
    state.ema_weight = 1 + decay * state.ema_weight
    return _result(ids, new, idx)
