"""Token sampling with llama.cpp's default sampler chain, vectorised over a batch of sequences.

The chain follows common/sampling.cpp and src/llama-sampling.cpp:
logit_bias -> penalties -> top_k -> top_p -> min_p -> temperature -> draw.
Greedy (temperature <= 0) is the argmax after logit_bias and penalties and uses no random draw.

top_k, top_p and min_p each keep a *prefix* of the logits sorted in descending order, so a row's
kept set is the shortest of the three prefixes, and a `topk` of a few candidates per row replaces
a full vocabulary sort whenever that prefix is short (the usual case).

n_probs / logprobs: the softmax of the bias/penalty-adjusted logits at temperature 1, before
truncation. (llama-server's default reports the raw logits' softmax; including bias and penalties
means a forbidden token reports probability 0.) They describe the model, not top_k/top_p/min_p.
"""

from __future__ import annotations

import itertools
import math
import random
import secrets
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from slotserver.model.sampling_params import MAX_N_PROBS, SamplingError, SamplingParams, _int

__all__ = ["MAX_N_PROBS", "SamplingError", "SamplingParams"]  # re-exported from slotserver.model.sampling_params
__all__ += ["History", "SampleOutput", "SequenceRng", "Sampler"]
__all__ += ["apply_logit_bias_", "apply_penalties_", "apply_penalties"]

History = Sequence[Sequence[int]]  # per row: the token ids so far (prompt + generated)


@dataclass
class SampleOutput:
    """One token per row. The probability fields are None unless some row has n_probs > 0; then
    they are filled for every row, and row i reads the first n_probs columns of the top fields."""

    tokens: torch.Tensor  # [batch] int64
    logprobs: torch.Tensor | None  # [batch] float32, the chosen token's log-probability
    top_ids: torch.Tensor | None  # [batch, max_n_probs] int64, most probable first
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


def _row_values(params: Sequence[SamplingParams], name: str, device: torch.device) -> torch.Tensor:
    return torch.tensor([getattr(p, name) for p in params], dtype=torch.float32, device=device)  # [batch]


def _window(params: SamplingParams, history: Sequence[int]) -> Sequence[int]:
    """The last repeat_last_n tokens (-1: all), or nothing when penalties are inactive."""
    if not params.penalties_active:
        return ()
    return history if params.repeat_last_n == -1 else history[-params.repeat_last_n :]


def apply_logit_bias_(logits: torch.Tensor, params: Sequence[SamplingParams]) -> torch.Tensor:
    """Add each row's logit_bias in place; a repeated token adds up, as llama.cpp applies each in turn."""
    vocab, device = logits.shape[1], logits.device
    entries = [(row, tok, bias) for row, p in enumerate(params) for tok, bias in p.logit_bias]
    if not entries:
        return logits
    rows, toks, biases = zip(*entries)
    if max(toks) >= vocab:
        raise SamplingError(f"logit_bias token {max(toks)} is outside the vocabulary [0, {vocab})")
    index = (torch.tensor(rows, device=device), torch.tensor(toks, device=device))
    return logits.index_put_(index, torch.tensor(biases, dtype=logits.dtype, device=device), accumulate=True)


def apply_penalties_(logits: torch.Tensor, params: Sequence[SamplingParams], history: History) -> torch.Tensor:
    """Apply repeat/frequency/presence penalties in place to float32 `logits` [batch, vocab].

    For each token seen c > 0 times in the row's window: logit /= repeat_penalty if logit > 0
    else logit *= repeat_penalty; then logit -= c * frequency_penalty + presence_penalty.
    Counts come from sorting the padded [batch, window] history rather than from a [batch, vocab]
    table, whose fresh allocation each step costs more in page faults than all of the sampling.
    """
    windows = [_window(p, h) for p, h in zip(params, history)]
    device, vocab = logits.device, logits.shape[1]
    lengths = torch.tensor([len(w) for w in windows], device=device)  # [batch]
    width = int(lengths.max()) if windows else 0
    if width == 0:
        return logits
    flat = torch.tensor(list(itertools.chain.from_iterable(windows)), dtype=torch.int64, device=device)
    if int(flat.min()) < 0 or int(flat.max()) >= vocab:
        raise SamplingError(f"history contains token ids outside the vocabulary [0, {vocab})")
    valid = torch.arange(width, device=device)[None, :] < lengths[:, None]  # [batch, width]
    ids = torch.full(valid.shape, -1, device=device).masked_scatter_(valid, flat)  # [batch, width], pads -1
    # Pads write to token 0 the value computed from token 0's own count (unchanged if it is
    # absent), so all writes to a token agree and the scatter below is deterministic.
    target = ids.clamp(min=0)  # [batch, width]
    ordered = ids.sort(dim=1).values  # [batch, width]
    count = torch.searchsorted(ordered, target, right=True) - torch.searchsorted(ordered, target)
    old = logits.gather(1, target)  # [batch, width]
    names = ("repeat_penalty", "frequency_penalty", "presence_penalty")
    rep, freq, pres = (_row_values(params, name, device)[:, None] for name in names)  # [batch, 1] each
    new = torch.where(old > 0, old / rep, old * rep) - (count * freq + pres)
    return logits.scatter_(1, target, torch.where(count > 0, new, old))


def apply_penalties(logits: torch.Tensor, params: Sequence[SamplingParams], history: History) -> torch.Tensor:
    """Out-of-place `apply_penalties_` on a float32 copy of `logits` [batch, vocab]."""
    return apply_penalties_(logits.to(torch.float32, copy=True), params, history)


def _inverse_cdf(weights: torch.Tensor, uniform: torch.Tensor) -> torch.Tensor:
    """Per row, the first column whose cumulative weight exceeds u * total (overwrites `weights`).

    Weights need not be normalised. Searching right of the target never lands on a zero-weight
    column, and the target stays below the total so rounding cannot run past the last column.
    """
    cdf = weights.cumsum_(dim=1)  # [rows, cols]
    total = cdf[:, -1:]  # [rows, 1]
    target = torch.minimum((uniform[:, None] * total).to(cdf.dtype), torch.nextafter(total, total.new_zeros(())))
    return torch.searchsorted(cdf, target, right=True).squeeze(1).clamp(max=cdf.shape[1] - 1)  # [rows]


class _Batch:
    """The adjusted logits of one sample() call, per-row settings, and reductions computed once.

    When the vocab splits into blocks of 16-128 columns, row maxima and top candidates come from
    per-block maxima: the k largest logits lie in the k blocks with the largest maxima, so a top-k
    reads only k blocks after one `amax` pass (about 3x faster than torch.topk on CPU).
    """

    def __init__(self, adj: torch.Tensor, params: Sequence[SamplingParams]) -> None:
        self.adj, self.params, self.vocab = adj, params, adj.shape[1]  # adj: [batch, vocab] float32
        self.greedy = [p.greedy for p in params]
        self.top_k_list = [p.top_k if 0 < p.top_k < self.vocab else self.vocab for p in params]  # vocab: off
        self.top_k = torch.tensor(self.top_k_list, device=adj.device)  # [batch]
        self.block = next((n for n in (64, 128, 32, 16) if self.vocab % n == 0 and self.vocab >= 8 * n), 0)
        if self.block:
            self.blocks = adj.reshape(adj.shape[0], -1, self.block)  # [batch, n_blocks, block]
            self.block_max = self.blocks.amax(dim=2)  # [batch, n_blocks]
            self.row_max, best = self.block_max.max(dim=1)  # [batch] each; first block on ties
            inner = self.blocks.gather(1, best[:, None, None].expand(-1, 1, self.block))  # [batch, 1, block]
            self.argmax = best * self.block + inner.squeeze(1).argmax(dim=1)  # first index on ties
        else:
            self.row_max, self.argmax = adj.max(dim=1)  # [batch] each
        self._lse: torch.Tensor | None = None
        self._top: tuple[torch.Tensor, torch.Tensor] | None = None

    def values(self, name: str) -> torch.Tensor:
        return _row_values(self.params, name, self.adj.device)  # [batch]

    @property
    def lse(self) -> torch.Tensor:
        """Full-vocabulary logsumexp [batch]: every row when probabilities are reported, else only
        rows using top_p without top_k; NaN in rows that never read it (skipping their exps is most
        of the cost)."""
        if self._lse is None:
            report = any(p.n_probs > 0 for p in self.params)
            need = [
                report or (not g and k == self.vocab and p.top_p < 1)
                for p, g, k in zip(self.params, self.greedy, self.top_k_list)
            ]
            idx = torch.tensor([i for i, n in enumerate(need) if n], dtype=torch.int64, device=self.adj.device)
            shift = self.row_max.index_select(0, idx)  # [n]
            rows = self.adj if all(need) else self.adj.index_select(0, idx)  # [n, vocab]
            sums = (rows - shift[:, None]).exp_().sum(dim=1)  # [n]
            self._lse = torch.full_like(self.row_max, math.nan).index_copy_(0, idx, shift + sums.log())
        return self._lse

    def topk(self, width: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The `width` largest logits per row, descending, and their ids: [batch, width] each."""
        if self._top is None or self._top[0].shape[1] < width:
            if self.block and 2 * width * self.block <= self.vocab:
                best = torch.topk(self.block_max, width, dim=1).indices[:, :, None]  # [batch, width, 1]
                cand = self.blocks.gather(1, best.expand(-1, -1, self.block)).flatten(1)  # [batch, width*block]
                cand_ids = (best * self.block + torch.arange(self.block, device=best.device)).flatten(1)
                vals, pos = torch.topk(cand, width, dim=1)  # [batch, width] each
                self._top = vals, cand_ids.gather(1, pos)
            else:
                self._top = torch.topk(self.adj, width, dim=1)
        return self._top[0][:, :width], self._top[1][:, :width]


class Sampler:
    """Samples one token per row of a logits batch, each row with its own params and RNG.

    It reuses one float32 [batch, vocab] scratch buffer across calls (a fresh multi-MB allocation
    per step costs page faults comparable to the whole step), so use it from one thread at a time.
    """

    def __init__(self, vocab_size: int) -> None:
        self.vocab_size = _int("vocab_size", vocab_size, lo=1)
        self._buffer: torch.Tensor | None = None

    def sample(
        self, logits: torch.Tensor, params: Sequence[SamplingParams], rngs: Sequence[SequenceRng], history: History
    ) -> SampleOutput:
        """logits [batch, vocab] (any float dtype, computed in float32, never modified); history[i]
        is row i's token ids, of which the sampler itself takes the last repeat_last_n."""
        batch = logits.shape[0] if logits.dim() == 2 else -1
        if logits.dim() != 2 or logits.shape[1] != self.vocab_size:
            raise SamplingError(f"logits must be [batch, {self.vocab_size}], got {tuple(logits.shape)}")
        if not len(params) == len(rngs) == len(history) == batch:
            raise SamplingError(f"params, rngs and history must each have {batch} rows")
        edits = any(p.logit_bias or p.penalties_active for p in params)  # in place, on our own buffer
        adj = self._scratch(logits).copy_(logits) if edits else logits.to(torch.float32)  # [batch, vocab]
        b = _Batch(apply_penalties_(apply_logit_bias_(adj, params), params, history), params)
        bad = ~torch.isfinite(b.row_max)  # NaN propagates through max, so NaN logits land here too
        if bool(bad.any()):
            row = int(bad.nonzero()[0])
            raise SamplingError(f"row {row}: logits are NaN/inf or logit_bias forbids every token")
        tokens = b.argmax  # [batch]
        if not all(b.greedy):
            uniform = [0.0 if g else r.next_uniform() for r, g in zip(rngs, b.greedy)]  # one draw per row
            tokens = self._draw(b, torch.tensor(uniform, dtype=torch.float64, device=adj.device))
        return self._report(b, tokens, min(max((p.n_probs for p in params), default=0), self.vocab_size))

    def _scratch(self, logits: torch.Tensor) -> torch.Tensor:
        buf = self._buffer
        if buf is None or buf.shape[0] < logits.shape[0] or buf.device != logits.device:
            buf = self._buffer = torch.empty(logits.shape, dtype=torch.float32, device=logits.device)
        return buf[: logits.shape[0]]

    def _draw(self, b: _Batch, uniform: torch.Tensor) -> torch.Tensor:
        """Non-greedy rows: untruncated ones draw over the whole vocab, the others over sorted candidates."""
        untruncated = [
            not g and k == b.vocab and p.top_p >= 1 and p.min_p <= 0
            for p, g, k in zip(b.params, b.greedy, b.top_k_list)
        ]
        rows = [not g and not u for g, u in zip(b.greedy, untruncated)]
        tokens = b.argmax
        if any(rows):
            tokens = torch.where(torch.tensor(rows, device=b.adj.device), self._draw_sorted(b, uniform, rows), tokens)
        if any(untruncated):  # no sort needed: the CDF can run in vocabulary order
            idx = torch.tensor([i for i, u in enumerate(untruncated) if u], device=b.adj.device)  # [n]
            shift, temp = b.row_max[idx, None], b.values("temperature")[idx, None]  # [n, 1] each
            weights = b.adj.index_select(0, idx).sub_(shift).div_(temp).exp_()  # [n, vocab]
            tokens = tokens.index_copy(0, idx, _inverse_cdf(weights, uniform[idx]))
        return tokens

    def _draw_sorted(self, b: _Batch, uniform: torch.Tensor, rows: list[bool]) -> torch.Tensor:
        """top_k -> top_p -> min_p -> temperature -> draw, on each row's descending top candidates.

        A row with top_k on needs its whole top_k prefix (top_p renormalises over top_k's
        survivors). A row without top_k is open: its kept set ends where top_p's mass or min_p's
        floor is reached, unknown before sorting, so the width starts from a guess and grows until
        every open row's end is in view. Peaked distributions thus never sort the vocabulary.
        """
        is_open = [r and k == b.vocab for r, k in zip(rows, b.top_k_list)]
        width = max((k for k, r, o in zip(b.top_k_list, rows, is_open) if r and not o), default=1)
        width = max(width, min(b.vocab, 64)) if any(is_open) else width
        open_rows = torch.tensor(is_open, device=b.adj.device)  # [batch]
        while True:
            vals, ids = b.topk(width)  # [batch, width] each
            keep, resolved = self._keep_lengths(b, vals, open_rows)  # [batch] each
            if width == b.vocab or bool(resolved.all()):
                break
            width = min(b.vocab, width * 8)
        temp = torch.tensor([1.0 if g else p.temperature for p, g in zip(b.params, b.greedy)], device=b.adj.device)
        col = torch.arange(width, device=b.adj.device)[None, :]  # [1, width]
        scaled = vals.masked_fill(col >= keep[:, None], -math.inf) / temp[:, None]  # [batch, width]
        pick = _inverse_cdf(torch.softmax(scaled, dim=1), uniform)  # [batch]
        return ids.gather(1, pick[:, None]).squeeze(1)  # [batch]

    def _keep_lengths(
        self, b: _Batch, vals: torch.Tensor, open_rows: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Kept prefix length per row [batch], and whether it is final (its end is in view) [batch]."""
        width = vals.shape[1]
        col = torch.arange(width, device=vals.device)[None, :]  # [1, width]
        in_k = vals.masked_fill(col >= b.top_k[:, None], -math.inf)  # [batch, width]
        top_p, min_p = b.values("top_p"), b.values("min_p")  # [batch] each
        norm = torch.logsumexp(in_k, dim=1)  # [batch]: top_p's normaliser, exact where top_k <= width
        if bool((open_rows & (top_p < 1)).any()):  # top_k off: normalise over the whole vocab
            norm = torch.where(open_rows & (b.top_k > width), b.lse, norm)
        cum = torch.cumsum(torch.exp(in_k - norm[:, None]), dim=1)  # [batch, width]
        n_p = torch.where(top_p < 1, (cum < top_p[:, None]).sum(dim=1) + 1, width + 1)  # first to reach top_p
        n_min = (vals >= vals[:, :1] + torch.log(min_p)[:, None]).sum(dim=1)  # log(0) = -inf keeps all
        keep = torch.minimum(torch.minimum(b.top_k.clamp(max=width), n_p.clamp(max=width)), n_min)
        return keep.clamp(min=1), ~open_rows | (n_p <= width) | (n_min < width)

    def _report(self, b: _Batch, tokens: torch.Tensor, n_probs: int) -> SampleOutput:
        """Chosen-token logprob and top-n alternatives under the adjusted temperature-1 softmax."""
        if n_probs == 0:
            return SampleOutput(tokens, None, None, None)
        lse = b.lse[:, None]  # [batch, 1]
        chosen = (b.adj.gather(1, tokens[:, None]) - lse).squeeze(1)  # [batch]
        top_vals, top_ids = b.topk(n_probs)  # [batch, n_probs] each
        return SampleOutput(tokens, chosen, top_ids.contiguous(), top_vals - lse)
