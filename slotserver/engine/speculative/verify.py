"""Verifying a draft: the target's tokens for the rows of one drafted chunk, kept while they match.

Row i of a chunk `[x, d1 .. dk]` holds the target's logits after `x, d1 .. di`. The target's token
is sampled from row 0; while it equals d1 the next is sampled from row 1, and so on; the first
token that differs from its draft (or the token after the last draft) ends the run. The run is
what the sequence gets: every draft matched plus one token of the target's own.

Why this rule and not rejection sampling's accept-with-probability p/q: the drafters here are
deterministic (n-gram lookups, a draft model's argmax), so q is one-hot, and then sampling the
target's row and comparing is rejection sampling (accept d with probability p(d), else draw from
p with d removed, renormalized: the same law). Sampling each row with the sequence's own sampler
and random stream, one draw per emitted token in order, also gives token for token what decoding
without speculation gives for the same seed (llama.cpp's `common_sampler_sample_and_accept_n`
does the same; its test_speculative.py checks it), and penalties, DRY and mirostat see exactly the
history they would have seen. Greedy rows on the plain chain take one argmax over all rows.
"""

from __future__ import annotations

import torch

from slotserver.model.sampling.greedy import greedy_tokens, greedy_tokens_device
from slotserver.model.sampling.sampler import Sampler


def accept_greedy(tokens: list[int], draft: tuple[int, ...]) -> int:
    """tokens: the target's argmax of each of the k+1 rows -> how many of them the sequence gets."""
    m = 0
    while m < len(draft) and tokens[m] == draft[m]:
        m += 1
    return m + 1


def greedy_run(rows: torch.Tensor, params, draft: tuple[int, ...], sampler: Sampler) -> list[int] | None:
    """Every row's argmax in one pass when the sequence decodes greedily on the plain chain; -> the
    accepted run's tokens, or None (then `sampled_run`)."""
    k1 = len(draft) + 1
    if rows.is_cpu:
        tokens = greedy_tokens(rows, [params] * k1, sampler.scratch_for(rows))
    else:
        tokens = greedy_tokens_device(rows, [params] * k1)
    if tokens is None:
        return None
    tokens = tokens.tolist()
    return tokens[: accept_greedy(tokens, draft)]


def sampled_run(sampler: Sampler, rows: torch.Tensor, seq, draft: tuple[int, ...]):
    """Row by row with the sequence's sampler, rng and history; -> the sampler's outputs of the run
    (one per token), to be turned into `Sampled` by the caller. Raises SamplingError as `sample`."""
    outs = []
    for i in range(len(draft) + 1):
        out = sampler.sample(rows[i: i + 1], [seq.params], [seq.rng], [seq.tokens + list(draft[:i])])
        outs.append(out)
        if i == len(draft) or int(out.tokens[0]) != draft[i]:
            break
    return outs


def synth_run(sampler: Sampler, rows: torch.Tensor, seq, draft: tuple[int, ...], probs: tuple[float, ...],
              eog: frozenset[int]) -> tuple[list, list[int]]:
    """llama.cpp's synthetic acceptance (`server_sample_and_accept_synth`, benchmarking only): each
    row is sampled as usual, but draft i is kept at random with `probs[i]` (never an end-of-generation
    token) instead of when it matches. -> (the sampler outputs of the rows sampled, the run's tokens).
    The draws come from the sequence's second stream `seq.spec.synth_rng`, seeded with its seed."""
    outs, tokens = [], []
    for i in range(len(draft) + 1):
        out = sampler.sample(rows[i: i + 1], [seq.params], [seq.rng], [seq.tokens + tokens])
        outs.append(out)
        if i == len(draft):
            tokens.append(int(out.tokens[0]))
            break
        keep = seq.spec.synth_rng.next_uniform() < probs[i]
        if not keep or draft[i] in eog:
            tokens.append(int(out.tokens[0]))
            break
        tokens.append(draft[i])
    return outs, tokens
