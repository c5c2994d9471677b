"""One row's top_k -> top_p -> min_p -> temperature -> draw, on its descending candidates, in
Python floats.

Why not torch: after the batched top-k (sampler.py), a row has a few dozen candidates, and the
~45 small torch calls that truncated and drew them for the whole batch cost ~5 us each whatever
their size (0.3 ms of a one-sequence step, 0.9 ms at eight sequences), where these loops take
~20 us a row. Float64 throughout, like the per-row port of llama.cpp's chain the tests compare
with; every row takes the same path whatever the batch, so a seed draws the same token alone or
batched.
"""

from __future__ import annotations

import bisect
import itertools
import math


def keep_length(vals: list[float], top_k: int, top_p: float, min_p: float, is_open: bool,
                lse: float | None = None) -> tuple[int, bool]:
    """vals: the row's `width` largest adjusted logits, descending. top_k: the kept count (the
    vocabulary size when top_k is off: an *open* row). lse: the whole vocabulary's logsumexp, the
    normaliser of top_p for an open row whose top_k prefix is not all in view.
    -> (tokens kept, whether that is final: the row's end lies within `vals`)."""
    width = len(vals)
    in_k = min(top_k, width)
    n_p = width + 1                                   # top_p not reached within the candidates
    if top_p < 1:
        norm = lse if lse is not None else _logsumexp(vals[:in_k])
        cum = 0.0
        for j in range(in_k):
            cum += math.exp(vals[j] - norm)
            if cum >= top_p:
                n_p = j + 1
                break
    n_min = width
    if min_p > 0:
        floor = vals[0] + math.log(min_p)
        n_min = next((j for j, x in enumerate(vals) if x < floor), width)
    keep = max(1, min(in_k, n_p, n_min))
    return keep, not is_open or n_p <= width or n_min < width


def draw(vals: list[float], keep: int, temperature: float, u: float) -> int:
    """Index (into vals) drawn from the softmax of the first `keep` values at `temperature`, by the
    inverse CDF at u in [0, 1): the first column whose cumulative weight exceeds u * total. The
    target stays below the total, so rounding never runs past the last column, and a zero-weight
    column (a -inf logit) is never the first to exceed it."""
    top = vals[0]
    cdf = list(itertools.accumulate(math.exp((x - top) / temperature) for x in vals[:keep]))
    total = cdf[-1]
    target = min(u * total, math.nextafter(total, 0.0))
    return min(bisect.bisect_right(cdf, target), keep - 1)


def _logsumexp(xs: list[float]) -> float:
    top = xs[0]
    return top + math.log(math.fsum(math.exp(x - top) for x in xs))
