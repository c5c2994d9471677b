"""logit_bias and the repeat/frequency/presence penalties, batched over rows (llama.cpp semantics).

Used by the batched fast path (sampler.py) and, one row at a time, by the full chain (chain.py).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import torch

from slotserver.model.sampling.params import SamplingError, SamplingParams

History = Sequence[Sequence[int]]  # per row: the token ids so far (prompt + generated)


def _row_values(params: Sequence[SamplingParams], name: str, device: torch.device) -> torch.Tensor:
    return torch.tensor([getattr(p, name) for p in params], dtype=torch.float32, device=device)  # [batch]


def _window(params: SamplingParams, history: Sequence[int]) -> Sequence[int]:
    """The last repeat_last_n tokens (-1: all), or nothing when penalties are inactive."""
    if not params.penalties_active:
        return ()
    return history if params.repeat_last_n == -1 else history[-params.repeat_last_n :]


def check_bias_tokens(tokens: Sequence[int], vocab: int) -> None:
    """logit_bias ids against the model's vocabulary (the params only know they are >= 0)."""
    bad = next((t for t in tokens if not 0 <= t < vocab), None)
    if bad is not None:
        raise SamplingError(f"logit_bias token {bad} is outside the vocabulary [0, {vocab})")


def apply_logit_bias_(logits: torch.Tensor, params: Sequence[SamplingParams]) -> torch.Tensor:
    """Add each row's logit_bias in place; a repeated token adds up, as llama.cpp applies each in turn."""
    vocab, device = logits.shape[1], logits.device
    entries = [(row, tok, bias) for row, p in enumerate(params) for tok, bias in p.logit_bias]
    if not entries:
        return logits
    rows, toks, biases = zip(*entries)
    check_bias_tokens(toks, vocab)
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
    if not any(windows):   # no row penalizes (the default): no tensors made
        return logits
    device, vocab = logits.device, logits.shape[1]
    lengths = torch.tensor([len(w) for w in windows], device=device)  # [batch]
    width = int(lengths.max())
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
