"""Token sampling with llama.cpp's default sampler chain, vectorised over a batch of sequences.

The chain follows common/sampling.cpp and src/llama-sampling.cpp:
logit_bias -> penalties -> top_k -> top_p -> min_p -> temperature -> draw.
Greedy (temperature <= 0) is the argmax after logit_bias and penalties and uses no random draw.

top_k, top_p and min_p each keep a *prefix* of the logits sorted in descending order, so the kept
set of a row is the shortest of the three prefixes. That lets one `topk` over the batch replace a
full vocabulary sort whenever top_k or min_p bound the candidate count (the usual case).

n_probs / logprobs choice: probabilities are the softmax of the bias/penalty-adjusted logits at
temperature 1, before truncation (llama-server's default, `post_sampling_probs=false`, also reports
pre-truncation probabilities). They therefore describe the model, not the sampler's settings.
"""

from __future__ import annotations

import itertools
import math
import numbers
import random
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

MAX_N_PROBS = 100
History = Sequence[Sequence[int]]  # per row: the token ids so far (prompt + generated)


class SamplingError(ValueError):
    """A sampling parameter or sampler input is invalid; the message names the culprit."""


def _real(name: str, value: object, *, lo: float = -math.inf, hi: float = math.inf, positive: bool = False) -> float:
    """Validate a finite real in [lo, hi] (and > 0 if `positive`; bools rejected); return it as a float."""
    ok = isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(float(value))
    if not ok or not lo <= float(value) <= hi or (positive and float(value) <= 0):
        rng = " > 0" if positive else "" if (lo, hi) == (-math.inf, math.inf) else f" in [{lo}, {hi}]"
        raise SamplingError(f"{name} must be a finite number{rng}, got {value!r}")
    return float(value)


def _int(name: str, value: object, *, lo: int | None = None, hi: int | None = None) -> int:
    """Validate an integer in [lo, hi] (bools rejected) and return it as an int."""
    if not isinstance(value, numbers.Integral) or isinstance(value, bool):
        raise SamplingError(f"{name} must be an integer, got {value!r}")
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        raise SamplingError(f"{name} must be in [{lo}, {hi if hi is not None else 'inf'}], got {value!r}")
    return int(value)


def _logit_bias(value: object) -> tuple[tuple[int, float], ...]:
    """Normalise a mapping or iterable of (token, bias) pairs; -inf forbids, +inf/NaN are rejected."""
    try:
        pairs = [tuple(pair) for pair in (value.items() if isinstance(value, Mapping) else value)]  # type: ignore
    except TypeError:
        pairs = [()]
    out = []
    for pair in pairs:
        if len(pair) != 2:
            raise SamplingError(f"logit_bias must be (token, bias) pairs, got {value!r}")
        token, bias = _int("logit_bias token", pair[0], lo=0), pair[1]
        if not isinstance(bias, numbers.Real) or isinstance(bias, bool) or math.isnan(bias) or bias == math.inf:
            raise SamplingError(f"logit_bias bias for token {token} must be a number or -inf, got {bias!r}")
        out.append((token, float(bias)))
    return tuple(out)


@dataclass(frozen=True)
class SamplingParams:
    """Per-request sampling settings with llama.cpp defaults; invalid values raise SamplingError."""

    temperature: float = 0.8  # <= 0: greedy
    top_k: int = 40  # <= 0: disabled
    top_p: float = 0.95  # 1.0: disabled
    min_p: float = 0.05  # 0: disabled
    repeat_penalty: float = 1.0  # 1.0: disabled
    repeat_last_n: int = 64  # penalty window; 0 disables penalties, -1 = whole history
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token, bias); -inf forbids the token
    seed: int = -1  # -1: fresh random seed when the sequence's RNG is created
    n_probs: int = 0  # report the top-n probabilities of each sampled position

    def __post_init__(self) -> None:
        checked = {
            "temperature": _real("temperature", self.temperature),
            "top_k": _int("top_k", self.top_k),
            "top_p": _real("top_p", self.top_p, lo=0.0, hi=1.0),
            "min_p": _real("min_p", self.min_p, lo=0.0, hi=1.0),
            "repeat_penalty": _real("repeat_penalty", self.repeat_penalty, positive=True),
            "repeat_last_n": _int("repeat_last_n", self.repeat_last_n, lo=-1),
            "presence_penalty": _real("presence_penalty", self.presence_penalty),
            "frequency_penalty": _real("frequency_penalty", self.frequency_penalty),
            "logit_bias": _logit_bias(self.logit_bias),
            "seed": _int("seed", self.seed, lo=-1),
            "n_probs": _int("n_probs", self.n_probs, lo=0, hi=MAX_N_PROBS),
        }
        for name, value in checked.items():  # store normalised types (float, int, tuple)
            object.__setattr__(self, name, value)

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0

    @property
    def penalties_active(self) -> bool:
        """Mirrors llama.cpp: penalties are a no-op with an empty window or neutral values."""
        neutral = self.repeat_penalty == 1.0 and self.presence_penalty == 0 and self.frequency_penalty == 0
        return self.repeat_last_n != 0 and not neutral


@dataclass
class SampleOutput:
    """One sampled token per row; probability fields are None unless some row has n_probs > 0."""

    tokens: torch.Tensor  # [batch] int64
    logprobs: torch.Tensor | None  # [batch] float32, chosen token under the adjusted softmax
    top_ids: torch.Tensor | None  # [batch, max_n_probs] int64, best first; row i uses its first n_probs
    top_logprobs: torch.Tensor | None  # [batch, max_n_probs] float32


class SequenceRng:
    """A sequence's own random stream: same seed, same draws, whatever else is in the batch."""

    def __init__(self, seed: int = -1) -> None:
        seed = _int("seed", seed, lo=-1)
        self.seed = secrets.randbits(32) if seed == -1 else seed  # reported back to the client
        self._rng = random.Random(self.seed)

    def next_uniform(self) -> float:
        """A float in [0, 1)."""
        return self._rng.random()


def _window(params: SamplingParams, history: Sequence[int]) -> Sequence[int]:
    """The last repeat_last_n tokens (-1: all), or nothing when penalties are inactive."""
    if not params.penalties_active:
        return ()
    return history if params.repeat_last_n == -1 else history[-params.repeat_last_n :]


def _row_values(params: Sequence[SamplingParams], name: str, device: torch.device) -> torch.Tensor:
    return torch.tensor([getattr(p, name) for p in params], dtype=torch.float32, device=device)


def apply_penalties_(logits: torch.Tensor, params: Sequence[SamplingParams], history: History) -> torch.Tensor:
    """Apply repeat/frequency/presence penalties in place to float32 `logits` [batch, vocab].

    For each token seen c > 0 times in the row's window: logit /= repeat_penalty if logit > 0
    else logit *= repeat_penalty; then logit -= c * frequency_penalty + presence_penalty.
    Works on a padded [batch, window] history: padding points at token 0 with weight 0, and the
    write-back of token 0's value is then either its own correct penalised value or unchanged.
    """
    windows = [_window(p, h) for p, h in zip(params, history)]
    lengths = torch.tensor([len(w) for w in windows], device=logits.device)  # [batch]
    width = int(lengths.max()) if len(windows) else 0
    if width == 0:
        return logits
    flat = torch.tensor(list(itertools.chain.from_iterable(windows)), dtype=torch.int64, device=logits.device)
    if int(flat.min()) < 0 or int(flat.max()) >= logits.shape[1]:
        raise SamplingError(f"history contains token ids outside the vocabulary [0, {logits.shape[1]})")
    valid = torch.arange(width, device=logits.device)[None, :] < lengths[:, None]  # [batch, width]
    ids = torch.zeros(valid.shape, dtype=torch.int64, device=logits.device).masked_scatter_(valid, flat)
    counts = torch.zeros_like(logits).scatter_add_(1, ids, valid.to(logits.dtype))  # [batch, vocab]
    count = counts.gather(1, ids)  # [batch, width] occurrences of each window token
    old = logits.gather(1, ids)  # [batch, width]
    names = ("repeat_penalty", "frequency_penalty", "presence_penalty")
    rep, freq, pres = (_row_values(params, name, logits.device)[:, None] for name in names)  # [batch, 1]
    new = torch.where(old > 0, old / rep, old * rep) - (count * freq + pres)
    return logits.scatter_(1, ids, torch.where(count > 0, new, old))


def apply_penalties(logits: torch.Tensor, params: Sequence[SamplingParams], history: History) -> torch.Tensor:
    """Out-of-place `apply_penalties_` on a float32 copy of `logits` [batch, vocab]."""
    return apply_penalties_(logits.to(torch.float32, copy=True), params, history)


def apply_logit_bias_(logits: torch.Tensor, params: Sequence[SamplingParams]) -> torch.Tensor:
    """Add each row's logit_bias in place (repeated tokens add up, as llama.cpp applies them in turn)."""
    vocab = logits.shape[1]
    entries = [(row, tok, bias) for row, p in enumerate(params) for tok, bias in p.logit_bias]
    if not entries:
        return logits
    rows, toks, biases = zip(*entries)
    if max(toks) >= vocab:
        raise SamplingError(f"logit_bias token {max(toks)} is outside the vocabulary [0, {vocab})")
    index = (torch.tensor(rows, device=logits.device), torch.tensor(toks, device=logits.device))
    return logits.index_put_(index, torch.tensor(biases, dtype=logits.dtype, device=logits.device), accumulate=True)


def _inverse_cdf(probs: torch.Tensor, uniform: torch.Tensor) -> torch.Tensor:
    """Index of the first column whose cumulative probability exceeds u * total, per row.

    Searching to the right of the target never lands on a zero-probability column; the target is
    kept strictly below the total so float rounding of u * total cannot run past the last token.
    """
    cdf = torch.cumsum(probs, dim=1)  # [rows, cols]
    total = cdf[:, -1:]  # [rows, 1]
    target = (uniform[:, None] * total).to(cdf.dtype)  # [rows, 1]
    target = torch.minimum(target, torch.nextafter(total, torch.zeros_like(total)))
    return torch.searchsorted(cdf, target, right=True).squeeze(1).clamp(max=probs.shape[1] - 1)  # [rows]


class _Batch:
    """The adjusted logits of one sample() call with per-row settings and shared reductions."""

    def __init__(self, adj: torch.Tensor, params: Sequence[SamplingParams]) -> None:
        self.adj, self.params, self.vocab = adj, params, adj.shape[1]  # adj: [batch, vocab] float32
        self.row_max, self.argmax = adj.max(dim=1)  # [batch]; first index on ties, like llama.cpp
        self.greedy = [p.greedy for p in params]
        self.top_k = torch.tensor([p.top_k if 0 < p.top_k < self.vocab else self.vocab for p in params], device=adj.device)
        self._lse: torch.Tensor | None = None

    def values(self, name: str) -> torch.Tensor:
        return _row_values(self.params, name, self.adj.device)  # [batch]

    @property
    def lse(self) -> torch.Tensor:
        """Full-vocabulary logsumexp per row [batch], computed at most once."""
        if self._lse is None:
            self._lse = torch.logsumexp(self.adj, dim=1)
        return self._lse


class Sampler:
    """Samples one token per row of a logits batch, each row with its own params and RNG."""

    def __init__(self, vocab_size: int) -> None:
        self.vocab_size = _int("vocab_size", vocab_size, lo=1)

    def sample(
        self, logits: torch.Tensor, params: Sequence[SamplingParams], rngs: Sequence[SequenceRng], history: History
    ) -> SampleOutput:
        """logits [batch, vocab] (any float dtype, computed in float32); history[i] is row i's tokens."""
        batch = logits.shape[0] if logits.dim() == 2 else -1
        if logits.dim() != 2 or logits.shape[1] != self.vocab_size:
            raise SamplingError(f"logits must be [batch, {self.vocab_size}], got {tuple(logits.shape)}")
        if not len(params) == len(rngs) == len(history) == batch:
            raise SamplingError(f"params, rngs and history must each have {batch} rows")
        adj = apply_logit_bias_(logits.to(torch.float32, copy=True), params)  # [batch, vocab]
        b = _Batch(apply_penalties_(adj, params, history), params)
        bad = ~torch.isfinite(b.row_max)  # NaN propagates through max, so this catches NaN logits too
        if bool(bad.any()):
            raise SamplingError(f"row {int(bad.nonzero()[0])}: logits are NaN/inf or logit_bias forbids every token")
        tokens = b.argmax  # [batch]
        if not all(b.greedy):
            uniform = [0.0 if g else r.next_uniform() for r, g in zip(rngs, b.greedy)]  # one draw per row
            tokens = self._draw(b, torch.tensor(uniform, dtype=torch.float64, device=adj.device))
        return self._report(b, tokens, max(p.n_probs for p in params))

    def _draw(self, b: _Batch, uniform: torch.Tensor) -> torch.Tensor:
        """Non-greedy rows: untruncated ones draw over the whole vocab, the rest over sorted candidates."""
        off = [p.top_k <= 0 or p.top_k >= b.vocab and p.top_p >= 1 and p.min_p <= 0 for p in b.params]
        untruncated = [o and not g for o, g in zip(off, b.greedy)]
        tokens = b.argmax
        if any(not g and not u for g, u in zip(b.greedy, untruncated)):
            rows = torch.tensor([not g and not u for g, u in zip(b.greedy, untruncated)], device=b.adj.device)
            tokens = torch.where(rows, self._draw_sorted(b, uniform, untruncated), tokens)
        if any(untruncated):  # no sort needed: the CDF can run in vocabulary order
            idx = torch.tensor([i for i, u in enumerate(untruncated) if u], device=b.adj.device)  # [n]
            scaled = b.adj.index_select(0, idx) / b.values("temperature")[idx, None]  # [n, vocab]
            tokens = tokens.index_copy(0, idx, _inverse_cdf(torch.softmax(scaled, dim=1), uniform[idx]))
        return tokens

    def _width(self, b: _Batch, rows: list[bool]) -> tuple[int, list[bool]]:
        """Starting topk width for `rows`, and which rows are open (bounded by top_p alone).

        Each row needs the columns that surely hold its kept set: its whole top_k prefix when
        top_p is on too (top_p renormalises over top_k's survivors), else min(top_k, min_p count).
        Open rows start from a guess that _draw_sorted grows until their nucleus fits, which avoids
        a full vocabulary sort for peaked distributions.
        """
        top_k = b.top_k.tolist()
        use_minp = [r and p.min_p > 0 and not (k < b.vocab and p.top_p < 1) for p, r, k in zip(b.params, rows, top_k)]
        n_minp = [b.vocab] * len(rows)
        if any(use_minp):
            floor = b.row_max + torch.log(b.values("min_p"))  # [batch]
            n_minp = (b.adj >= floor[:, None]).sum(dim=1, dtype=torch.int32).tolist()
        bounds = [min(k, n) if m else k for k, n, m in zip(top_k, n_minp, use_minp)]
        is_open = [r and bd == b.vocab and p.top_p < 1 for r, bd, p in zip(rows, bounds, b.params)]
        width = max((bd for bd, r, o in zip(bounds, rows, is_open) if r and not o), default=1)
        return (max(width, min(b.vocab, 256)) if any(is_open) else width), is_open

    def _draw_sorted(self, b: _Batch, uniform: torch.Tensor, skip: list[bool]) -> torch.Tensor:
        """top_k -> top_p -> min_p -> temperature -> draw, on a descending topk of each row."""
        rows = [not g and not s for g, s in zip(b.greedy, skip)]
        width, is_open = self._width(b, rows)
        rows_t, open_t = (torch.tensor(m, device=b.adj.device) for m in (rows, is_open))  # [batch]
        while True:
            vals, ids = torch.topk(b.adj, width, dim=1)  # [batch, width], descending
            keep, n_p = self._keep_lengths(b, vals, rows_t)  # [batch]
            if width == b.vocab or not bool((open_t & (n_p > width)).any()):
                break
            width = min(b.vocab, width * 8)
        temp = torch.tensor([1.0 if g else p.temperature for p, g in zip(b.params, b.greedy)], device=b.adj.device)
        col = torch.arange(width, device=b.adj.device)[None, :]  # [1, width]
        scaled = vals.masked_fill(col >= keep[:, None], -math.inf) / temp[:, None]  # [batch, width]
        pick = _inverse_cdf(torch.softmax(scaled, dim=1), uniform)  # [batch]
        return ids.gather(1, pick[:, None]).squeeze(1)  # [batch]

    def _keep_lengths(self, b: _Batch, vals: torch.Tensor, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Kept prefix length per row [batch], and top_p's prefix length (may exceed the width) [batch]."""
        width = vals.shape[1]
        col = torch.arange(width, device=vals.device)[None, :]  # [1, width]
        in_k = vals.masked_fill(col >= b.top_k[:, None], -math.inf)  # [batch, width]
        top_p = b.values("top_p")  # [batch]
        norm = torch.logsumexp(in_k, dim=1)  # [batch], top_p's normaliser; exact where top_k <= width
        beyond = rows & (top_p < 1) & (b.top_k > width)  # normaliser needs the whole top_k prefix
        if bool(beyond.any()):
            norm = torch.where(beyond, b.lse, norm)
        cum = torch.cumsum(torch.exp(in_k - norm[:, None]), dim=1)  # [batch, width]
        n_p = torch.where(top_p < 1, (cum < top_p[:, None]).sum(dim=1) + 1, width)  # first reaching top_p
        floor = vals[:, :1] + torch.log(b.values("min_p"))[:, None]  # log(0) = -inf keeps everything
        n_min = (vals >= floor).sum(dim=1)
        keep = torch.minimum(torch.minimum(b.top_k.clamp(max=width), n_p.clamp(max=width)), n_min)
        return keep.clamp(min=1), n_p

    def _report(self, b: _Batch, tokens: torch.Tensor, n_probs: int) -> SampleOutput:
        """Chosen-token logprob and top-n alternatives under the adjusted temperature-1 softmax."""
        if n_probs == 0:
            return SampleOutput(tokens, None, None, None)
        lse = b.lse[:, None]  # [batch, 1]
        chosen = (b.adj.gather(1, tokens[:, None]) - lse).squeeze(1)  # [batch]
        top_vals, top_ids = torch.topk(b.adj, min(n_probs, b.vocab), dim=1)  # [batch, n]
        return SampleOutput(tokens, chosen, top_ids, top_vals - lse)
