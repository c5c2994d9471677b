"""The plain chain's arithmetic on a batch of logits, in torch ops that run where the tensors are.

On the GPU in service, on the CPU in the tests: nothing here reads a value back to decide what to
do next (no `.item()`, `bool(t)`, `nonzero`), so a step queues its whole chain and waits once, for
the small result tensor (slotserver/model/sampling/device.py). Every decision that depends on the
request, not on the logits, was taken on the host before.

Each function mirrors a piece of the host's fast path with the same arithmetic, so the tokens
agree wherever the logits are not at a rounding boundary or exactly equal (`top_candidates`):
- `penalize_`: penalties.py `apply_penalties_` (float32, the same formula and count);
- `keep_lengths`: row.py `keep_length` (float64; top_p over the top_k prefix, or over the whole
  vocabulary for an open row, whose normaliser is the full logsumexp);
- `draw_sorted`: row.py `draw` (float64 inverse CDF over the kept prefix, bisect_right);
- `draw_vocab`: sampler.py `_inverse_cdf` over the whole vocabulary in vocabulary order (float32
  for the fast path's untruncated rows; float64 of the scaled logits for chain.py's `dist`, which
  is what an untruncated post_sampling_probs row runs on the host).
"""

from __future__ import annotations

import math

import torch

NEG_INF = -math.inf


def unpack_bits(packed: torch.Tensor, vocab: int) -> torch.Tensor:
    """numpy's packbits(bitorder="little") rows: uint8 [m, ceil(vocab / 8)] -> bool [m, vocab]."""
    bits = (packed.unsqueeze(2) >> torch.arange(8, dtype=torch.uint8, device=packed.device)) & 1      # [m, bytes, 8]
    return bits.reshape(packed.shape[0], -1)[:, :vocab].bool()       # [m, vocab]


def penalize_(adj: torch.Tensor, ids: torch.Tensor, rep: torch.Tensor, freq: torch.Tensor,
              pres: torch.Tensor) -> torch.Tensor:
    """Repeat/frequency/presence penalties in place, as `apply_penalties_`: adj [B, V] float32;
    ids [B, W] int64, each row's window padded with -1; rep, freq, pres [B] float32.
    Pads write token 0's own value (unchanged unless token 0 is in the window), so every write to a
    token agrees and the scatter is deterministic."""
    target = ids.clamp(min=0)                                          # [B, W]
    ordered = ids.sort(dim=1).values                                   # [B, W]
    count = torch.searchsorted(ordered, target, right=True) - torch.searchsorted(ordered, target)
    old = adj.gather(1, target)                                        # [B, W]
    rep, freq, pres = rep[:, None], freq[:, None], pres[:, None]       # [B, 1] each
    new = torch.where(old > 0, old / rep, old * rep) - (count * freq + pres)
    return adj.scatter_(1, target, torch.where(count > 0, new, old))


def top_candidates(adj: torch.Tensor, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The `width` largest logits of each row, descending, equal values in id order (lowest first,
    as a stable sort leaves them): adj [s, V] float32 -> vals, ids [s, W].

    Why not torch.topk on the values: it orders ties its own way, on CUDA possibly differently
    with the batch's shape, and decides which tied tokens make the cut; a draw over the same values
    in another order picks another token, and a bf16 output layer gives float32 logits with many
    exact ties. One int64 key per logit (the float's order-preserving integer, then the reversed id)
    is distinct in a row, so the top `width` and their order are one answer alone or in any batch."""
    bits = adj.contiguous().view(torch.int32)                          # [s, V]
    key = torch.where(bits < 0, bits ^ 0x7FFFFFFF, bits)              # ordered as the floats
    rev = torch.arange(adj.shape[1] - 1, -1, -1, device=adj.device)    # [V] lower id, larger key
    _, ids = torch.topk(key.long() * 2**32 + rev, width, dim=1)        # [s, W]; * not <<: no shift of negatives
    return adj.gather(1, ids), ids


def _first(hit: torch.Tensor, default: int) -> torch.Tensor:
    """Per row, the first column where `hit` [B, W] is true, else `default`: [B] int64."""
    return torch.where(hit.any(dim=1), hit.to(torch.int32).argmax(dim=1).long(), default)


def keep_lengths(vals: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor, min_p: torch.Tensor,
                 full_lse: torch.Tensor | None, vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    """top_k -> top_p -> min_p on each row's `W` largest logits, as row.py `keep_length`.

    vals [B, W] float64, descending; top_k [B] int64 (vocab: off, an *open* row); top_p, min_p [B]
    float64; full_lse [B] (the whole row's logsumexp, top_p's normaliser for an open row whose end
    is not in view; None when no row needs it).
    -> keep [B] int64 (tokens kept, >= 1), done [B] bool: the row's end lies within the W columns
    (a closed row always; an open one when top_p's mass or min_p's floor is reached in view)."""
    width = vals.shape[1]
    col = torch.arange(width, device=vals.device)[None, :]             # [1, W]
    in_k = top_k.clamp(max=width)                                      # [B]
    inside = col < in_k[:, None]                                       # [B, W]
    norm = torch.where(inside, vals, NEG_INF).logsumexp(dim=1)         # [B] the top_k prefix's
    if full_lse is not None and width < vocab:
        norm = torch.where(top_k > width, full_lse.double(), norm)
    cum = torch.where(inside, (vals - norm[:, None]).exp(), 0.0).cumsum(dim=1)   # [B, W]
    n_p = _first((cum >= top_p[:, None]) & inside & (top_p[:, None] < 1), -1) + 1
    n_p = torch.where(n_p == 0, width + 1, n_p)                        # top_p not reached in view
    floor = vals[:, :1] + min_p.clamp(min=1e-300).log()[:, None]       # [B, 1]
    n_min = _first((vals < floor) & (min_p[:, None] > 0), width)
    keep = torch.minimum(torch.minimum(in_k, n_p), n_min).clamp(min=1)
    done = (top_k <= width) | (n_p <= width) | (n_min < width)
    return keep, done


def draw_sorted(vals: torch.Tensor, keep: torch.Tensor, temperature: torch.Tensor,
                uniform: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Inverse CDF over each row's first `keep` values at `temperature`, as row.py `draw`.

    vals [B, W] float64 descending; keep [B] int64; temperature [B] float64 (> 0; greedy rows are
    replaced by the caller); uniform [B] float64 in [0, 1).
    -> col [B] int64 (the drawn column), logp [B, W] float64: the kept tokens' log-probabilities
    under the final distribution (-inf past `keep` or where the weight underflows), which
    post_sampling_probs reports."""
    col = torch.arange(vals.shape[1], device=vals.device)[None, :]    # [1, W]
    scaled = (vals - vals[:, :1]) / temperature[:, None]               # [B, W], 0 in column 0
    kept = col < keep[:, None]                                         # [B, W]
    weights = torch.where(kept, scaled.exp(), 0.0)                     # [B, W]
    cdf = weights.cumsum(dim=1)                                        # [B, W]
    total = cdf.gather(1, (keep - 1)[:, None])                         # [B, 1]
    target = torch.minimum(uniform[:, None] * total, torch.nextafter(total, torch.zeros_like(total)))
    drawn = torch.minimum((cdf <= target).sum(dim=1), keep - 1)        # [B] bisect_right, within keep
    logp = torch.where(kept & (weights > 0), scaled - total.log(), NEG_INF)
    return drawn, logp


def draw_vocab(adj: torch.Tensor, temperature: torch.Tensor, uniform: torch.Tensor, row_max: torch.Tensor,
               exact: bool) -> torch.Tensor:
    """Untruncated rows: a draw over the whole vocabulary in vocabulary order (no sort), as the
    host does for rows with top_k, top_p and min_p all off.

    adj [n, V] float32; temperature [n] float64 (> 0); uniform [n] float64; row_max [n].
    exact=False: the fast path's float32 weights exp((x - max) / T); exact=True: chain.py's `dist`
    (float64 softmax of the float32 x / T), what a post_sampling_probs row draws from.
    -> tokens [n] int64: the first column whose cumulative weight exceeds u * total."""
    if exact:
        scaled = (adj / temperature[:, None].float()).double()                      # [n, V]
        weights = (scaled - scaled.amax(dim=1, keepdim=True)).exp_()
    else:
        weights = (adj - row_max[:, None]).div_(temperature[:, None].float()).exp_()  # [n, V]
    cdf = weights.cumsum_(dim=1)                                       # [n, V]
    total = cdf[:, -1:]                                                # [n, 1]
    target = torch.minimum((uniform[:, None] * total).to(cdf.dtype), torch.nextafter(total, total.new_zeros(())))
    return torch.searchsorted(cdf, target, right=True).squeeze(1).clamp(max=cdf.shape[1] - 1)


def vocab_final(adj: torch.Tensor, temperature: torch.Tensor, token: torch.Tensor,
                n: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """An untruncated post_sampling_probs row's final distribution: the softmax of adj / T over the
    whole vocabulary (float64 of the float32 quotient, as chain.py), its n most probable tokens.
    adj [m, V] float32; temperature [m]; token [m] the drawn ids.
    -> chosen [m], top_ids [m, n], top_logp [m, n] (-inf where p underflows to 0)."""
    scaled = (adj / temperature[:, None].float()).double()            # [m, V]
    lse = scaled.logsumexp(dim=1, keepdim=True)                        # [m, 1]
    vals, ids = torch.topk(scaled, n, dim=1)                           # [m, n] each
    logp = vals - lse
    logp = torch.where(logp.exp() > 0, logp, NEG_INF)
    chosen = (scaled.gather(1, token[:, None]) - lse).squeeze(1)
    return torch.where(chosen.exp() > 0, chosen, NEG_INF), ids, logp
