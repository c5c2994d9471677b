"""llama.cpp's `infill` sampler (src/llama-sampler.cpp, llama_sampler_infill_apply), for
fill-in-the-middle completions: llama.vim asks for `samplers: [top_k, top_p, infill]`.

What it does to the candidates (sorted by logit, descending), in llama.cpp's order and float32:
1. probabilities by softmax; if the end-of-generation tokens hold more than a third of the text
   tokens' mass per candidate (3 * p_eog * n > p_txt), only they are kept: the gap is filled.
2. candidates whose piece is a prefix of another's are merged pairwise, in llama.cpp's loop order
   (i0 ascending, then i1 ascending): the less probable one's probability moves to the more
   probable one and its logit becomes -inf. ("in" and "int" are one choice, not two.)
3. text tokens under p = 0.2 are dropped (end-of-generation tokens stay); if no text token is
   left, the one candidate left is the end-of-text token (EOT, else EOS) with logit 1.
4. renormalized, text tokens under 1 / (text tokens kept + 1) are dropped.

The sampler changes which candidates remain; the final draw (`dist`) recomputes probabilities from
their logits, as llama.cpp's does. llama.cpp compares every pair of candidates (quadratic: after
top_k 40 nothing; over a whole vocabulary, hours); here only the pairs whose pieces are prefixes of
each other are visited, in the same order, which gives the same merges.
"""

from __future__ import annotations

import functools
import math
from collections import defaultdict
from dataclasses import dataclass

import numpy as np
import torch


@dataclass(frozen=True)
class InfillVocab:
    """What the sampler reads of the vocabulary: each token's piece as llama.cpp's
    token_to_piece(special=False) gives it (control tokens: empty), the end-of-generation ids, and
    the token it falls back to (EOT, else EOS)."""

    pieces: tuple[bytes, ...]
    eog: frozenset[int]
    eot: int

    @functools.cached_property
    def prefixes(self) -> tuple[tuple[int, ...], ...]:
        """prefixes[id]: the other tokens whose non-empty piece starts id's piece (equal pieces
        included). Built once, at the first infill step (a 150k vocabulary: about a second), so a
        step visits only a candidate's few prefixes, not every pair."""
        where: dict[bytes, list[int]] = defaultdict(list)
        for i, piece in enumerate(self.pieces):
            if piece:
                where[piece].append(i)
        return tuple(tuple(i0 for end in range(1, len(piece) + 1) for i0 in where.get(piece[:end], ()) if i0 != i1)
                     for i1, piece in enumerate(self.pieces))

    @classmethod
    def of(cls, tokenizer) -> InfillVocab | None:
        eot = tokenizer.special_ids.get("eot_token_id", tokenizer.eos_id)
        if eot is None:
            return None
        pieces = tuple(tokenizer.token_bytes(i) for i in range(tokenizer.vocab_size))
        return cls(pieces, frozenset(tokenizer.eog_ids), int(eot))


def _prefix_pairs(ids: list[int], vocab: InfillVocab) -> list[list[int]]:
    """pairs[i0]: every candidate position i1 != i0 (ascending) whose piece starts with i0's non-empty piece."""
    at = {tid: pos for pos, tid in enumerate(ids)}   # a token is a candidate once
    pairs: list[list[int]] = [[] for _ in ids]
    for i1, tid in enumerate(ids):
        for prefix in vocab.prefixes[tid]:
            i0 = at.get(prefix)
            if i0 is not None:
                pairs[i0].append(i1)
    return [sorted(p) for p in pairs]


def _merge(p: np.ndarray, logits: list[float], pairs: list[list[int]]) -> None:
    """Step 2, in place: llama.cpp's double loop over the pairs that can merge."""
    for i0, partners in enumerate(pairs):
        for i1 in partners:
            if logits[i0] == -math.inf:
                break
            if logits[i1] == -math.inf:
                continue
            dst, src = (i1, i0) if p[i1] > p[i0] else (i0, i1)
            p[dst] += p[src]
            logits[src], p[src] = -math.inf, np.float32(0)


def _threshold(p: np.ndarray, keep: list[int], is_eog: list[bool], thold: np.float32) -> tuple[list[int], np.ndarray]:
    """Keep the candidates at or above `thold` and every end-of-generation one; renormalize."""
    kept = [i for i in keep if is_eog[i] or not p[i] < thold]
    total = np.float32(0)
    for i in kept:
        total += p[i]
    q = p.copy()
    q[kept] = p[kept] / total
    return kept, q


def infill(ids: torch.Tensor, logits: torch.Tensor, vocab: InfillVocab) -> tuple[torch.Tensor, torch.Tensor]:
    """ids [n] int64, logits [n] float32, sorted by logit descending -> the candidates kept (same order)."""
    n = ids.numel()
    if n == 0:
        return ids, logits
    p = torch.softmax(logits.float(), dim=0).numpy().astype(np.float32)
    id_list, lg = ids.tolist(), logits.tolist()
    is_eog = [i in vocab.eog for i in id_list]
    p_eog = np.float32(sum((p[i] for i in range(n) if is_eog[i]), np.float32(0)))
    p_txt = np.float32(sum((p[i] for i in range(n) if not is_eog[i]), np.float32(0)))
    if 3 * p_eog * n > p_txt:
        keep = [i for i in range(n) if is_eog[i]]
        return ids[keep], logits[keep]
    _merge(p, lg, _prefix_pairs(id_list, vocab))
    keep, p = _threshold(p, list(range(n)), is_eog, np.float32(0.2))
    n_text = sum(not is_eog[i] for i in keep)
    if n_text == 0:
        return torch.tensor([vocab.eot], dtype=ids.dtype), torch.tensor([1.0], dtype=logits.dtype)
    keep, _ = _threshold(p, keep, is_eog, np.float32(1.0 / (n_text + 1)))
    out = torch.tensor([lg[i] for i in keep], dtype=logits.dtype)
    return ids[keep], out
