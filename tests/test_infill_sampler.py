"""The `infill` sampler (model/sampling/infill.py) against a literal transcription of llama.cpp's
llama_sampler_infill_apply (its quadratic loop, float32), on random candidates whose pieces are
often prefixes of each other; and its four steps on hand-made candidates."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
import torch

from slotserver.model.sampling.infill import InfillVocab, infill

PIECES = (b"in", b"int", b"inte", b"x", b"", b"i", b"integer", b"ab", b"abc", b"a", b"zz", b"z", b"q", b"w")
EOG = frozenset({len(PIECES), len(PIECES) + 1})          # two end-of-generation ids, empty pieces
VOCAB = InfillVocab(PIECES + (b"", b""), EOG, len(PIECES))


def llama_infill(ids: list[int], logits: list[float], vocab: InfillVocab) -> tuple[list[int], list[float]]:
    """llama.cpp's loop as written (every pair, float32 probabilities)."""
    f32 = np.float32
    n = len(ids)
    p = torch.softmax(torch.tensor(logits, dtype=torch.float32), 0).numpy()
    lg = list(logits)
    eog = [i in vocab.eog for i in ids]
    p_txt, p_eog = f32(0), f32(0)
    for i in range(n):
        if eog[i]:
            p_eog += p[i]
        else:
            p_txt += p[i]
    if 3 * p_eog * n > p_txt:
        keep = [i for i in range(n) if eog[i]]
        return [ids[i] for i in keep], [lg[i] for i in keep]
    for i0 in range(n):
        for i1 in range(n):
            if lg[i0] == -math.inf:
                break
            if i0 == i1 or lg[i1] == -math.inf:
                continue
            a, b = vocab.pieces[ids[i0]], vocab.pieces[ids[i1]]
            if len(a) > 0 and len(a) <= len(b) and b[:len(a)] == a:
                dst, src = (i1, i0) if p[i1] > p[i0] else (i0, i1)
                p[dst] += p[src]
                lg[src], p[src] = -math.inf, f32(0)
    keep, total, n_txt = [], f32(0), 0
    for i in range(n):
        if p[i] < f32(0.2) and not eog[i]:
            continue
        n_txt += not eog[i]
        total += p[i]
        keep.append(i)
    if n_txt == 0:
        return [vocab.eot], [1.0]
    for i in keep:
        p[i] /= total
    thold = f32(1.0 / (n_txt + 1))
    keep = [i for i in keep if eog[i] or not p[i] < thold]
    return [ids[i] for i in keep], [lg[i] for i in keep]


def _candidates(rng: random.Random, n: int, spread: float) -> tuple[torch.Tensor, torch.Tensor]:
    ids = rng.sample(range(len(VOCAB.pieces)), n)
    logits = sorted((rng.gauss(0, spread) for _ in ids), reverse=True)
    return torch.tensor(ids), torch.tensor(logits, dtype=torch.float32)


@pytest.mark.parametrize("seed", range(40))
def test_the_sampler_keeps_what_llama_cpps_loop_keeps(seed):
    rng = random.Random(seed)
    ids, logits = _candidates(rng, rng.randint(1, len(VOCAB.pieces)), rng.choice([0.3, 1.0, 3.0]))
    got_ids, got_logits = infill(ids, logits, VOCAB)
    want_ids, want_logits = llama_infill(ids.tolist(), logits.tolist(), VOCAB)
    assert got_ids.tolist() == want_ids and got_logits.tolist() == pytest.approx(want_logits)


def test_end_of_generation_wins_when_it_holds_a_third_of_the_mass_per_candidate():
    ids = torch.tensor([3, 14, 0])                                # "x", EOG, "in"
    logits = torch.log(torch.tensor([0.5, 0.2, 0.3]))             # 3 * 0.2 * 3 = 1.8 > 0.8
    got_ids, got_logits = infill(ids, logits, VOCAB)
    assert got_ids.tolist() == [14] and got_logits.tolist() == pytest.approx([math.log(0.2)])


def test_a_prefix_gives_its_mass_to_the_likelier_token_and_thin_tokens_are_dropped():
    # "int" 0.35, "in" 0.3, "x" 0.2, "ab" 0.15: "in" folds into "int" (0.65); then "x" 0.2 stays at
    # the first threshold (0.2), and after renormalizing (x: 0.2 / 0.85 = 0.235 < 1/3) it goes
    ids = torch.tensor([1, 0, 3, 7])
    logits = torch.log(torch.tensor([0.35, 0.3, 0.2, 0.15]))
    got_ids, _ = infill(ids, logits, VOCAB)
    assert got_ids.tolist() == [1]


def test_no_text_left_is_the_end_of_text_token():
    ids = torch.tensor([3, 4, 6, 8, 10, 12, 13])    # x, "", integer, abc, zz, q, w: no prefixes, 1/7 each < 0.2
    got_ids, got_logits = infill(ids, torch.zeros(7), VOCAB)
    assert got_ids.tolist() == [VOCAB.eot] and got_logits.tolist() == [1.0]
