"""llama.cpp's samplers beyond top_k/top_p/min_p/temperature, on fixed logits.

Expected values are llama.cpp's own (tests/test-sampling.cpp) where it has them, otherwise
computed by hand from src/llama-sampler.cpp's formulas.
"""

from __future__ import annotations

import math

import pytest
import torch

from slotserver.model.sampling.chain import Candidates, temperature_ext, top_n_sigma, typical, xtc
from slotserver.model.sampling.dry import dry_penalties, process_breakers
from slotserver.model.sampling.final import SamplerState, dist, mirostat_v2
from slotserver.model.sampling.sampler import Sampler, SamplingError, SamplingParams, SequenceRng


def cands(probs: list[float]) -> Candidates:
    """Token id i has probability probs[i] (logit = log p), as llama.cpp's sampler_tester builds them."""
    return Candidates.of(torch.arange(len(probs)), torch.tensor(probs).log())


def final(c: Candidates) -> dict[int, float]:
    """id -> probability of the distribution the final draw samples from (p > 0 only)."""
    r = dist(c.ids, c.logits, 0.5)
    return {int(i): math.exp(float(lp)) for i, lp in zip(r.ids, r.logprobs)}


def close(got: dict[int, float], want: dict[int, float]) -> bool:
    return got.keys() == want.keys() and all(abs(got[k] - want[k]) < 1e-5 for k in want)


# -- each sampler alone (llama.cpp's test-sampling.cpp vectors) ----------------------------------

@pytest.mark.parametrize(("probs", "p", "kept"), [
    ([0.97, 0.01, 0.01, 0.01], 0.5, {0}),
    ([0.4, 0.2, 0.2, 0.2], 0.5, {1, 2, 3}),  # the 0.2s are closer to the entropy than the 0.4
])
def test_typical_p_keeps_the_locally_typical_set(probs, p, kept):
    assert set(typical(cands(probs), p, 0).ids.tolist()) == kept


@pytest.mark.parametrize(("threshold", "kept"), [(0.09, {3}), (0.19, {2, 3}), (0.29, {1, 2, 3}), (0.39, {0, 1, 2, 3})])
def test_xtc_removes_every_top_token_above_threshold_but_the_last(threshold, kept):
    c = xtc(cands([0.4, 0.3, 0.2, 0.1]), 1.0, threshold, 0, lambda: 0.5)
    assert set(c.ids.tolist()) == kept


def test_xtc_fires_with_its_probability_and_respects_min_keep():
    c = cands([0.4, 0.3, 0.2, 0.1])
    assert xtc(c, 0.3, 0.09, 0, lambda: 0.31).ids.numel() == 4  # the coin said no
    assert xtc(c, 0.3, 0.09, 0, lambda: 0.29).ids.numel() == 1
    assert xtc(c, 1.0, 0.09, 2, lambda: 0.0).ids.numel() == 4  # would leave 1 < min_keep
    assert xtc(c, 1.0, 0.6, 0, lambda: 0.0).ids.numel() == 4  # threshold > 0.5: off


@pytest.mark.parametrize(("n", "want"), [
    (1.0, {2: 0.428571, 3: 0.571429}),
    (0.0, {0: 0.1, 1: 0.2, 2: 0.3, 3: 0.4}),  # <= 0 is off
    (3.0, {0: 0.1, 1: 0.2, 2: 0.3, 3: 0.4}),
])
def test_top_n_sigma_keeps_logits_within_n_std_of_the_max(n, want):
    assert close(final(top_n_sigma(cands([0.1, 0.2, 0.3, 0.4]), n)), want)


@pytest.mark.parametrize(("history", "mult", "allowed", "last_n", "breakers", "want"), [
    ([0, 1], 1.0, 2, 4, (), {0: 0.25, 1: 0.25, 2: 0.25, 3: 0.25}),
    ([0, 1, 2, 0, 1], 1.0, 2, 5, (), {0: 0.296923, 1: 0.296923, 2: 0.109232, 3: 0.296923}),
    ([0, 1, 2, 0, 1], 2.0, 2, 5, (), {0: 0.241818, 1: 0.241818, 2: 0.032727, 3: 0.241818, 4: 0.241818}),
    ([0, 1, 3, 4, 0, 1], 1.0, 2, 6, ((3, ()),), {i: 0.2 for i in range(5)}),  # the breaker cuts the repeat
    ([0, 1, 2, 3, 4, 0, 1], 1.0, 4, 7, (), {i: 0.2 for i in range(5)}),  # repeat shorter than allowed
])
def test_dry_matches_llama_cpps_own_vectors(history, mult, allowed, last_n, breakers, want):
    n = len(want)
    c = cands([1.0 / n] * n)
    table = dry_penalties(history, mult, 1.1, allowed, last_n, breakers)
    logits = c.logits - torch.tensor([table.get(int(i), 0.0) for i in c.ids])
    assert close(final(Candidates.of(c.ids, logits)), want)


def test_dry_penalty_grows_as_multiplier_times_base_to_the_excess_length():
    history = [5, 6, 7, 8, 9, 1, 5, 6, 7, 8]  # "5 6 7 8" repeats; 9 would extend it to length 5
    assert dry_penalties(history, 0.8, 1.75, 2, 64, ()) == pytest.approx({9: 0.8 * 1.75 ** (4 - 2)})
    assert dry_penalties(history, 0.8, 1.75, 2, 4, ()) == {}  # the window no longer holds the repeat
    assert dry_penalties(history, 0.8, 1.75, 2, 64, ((7, ()),)) == {}  # a breaker inside limits it to 1
    assert dry_penalties(history, 0.8, 1.75, 2, 64, ((9, ()),)) == {}  # a whole breaker is never penalised


class FakeTokenizer:
    """Pieces: 0 "a", 1 "b\\n", 2 "x:", 3 "c*", 4 "y", 5 "ab"; `encode` maps a known piece to its
    id and anything else to 99."""

    pieces = [b"a", b"b\n", b"x:", b"c*", b"y", b"ab"]
    vocab_size = len(pieces)

    def token_bytes(self, id: int, special: bool = False) -> bytes:
        return self.pieces[id]

    def encode(self, text: str, add_special: bool = True, parse_special: bool = False) -> list[int]:
        return [self.pieces.index(text.encode())] if text.encode() in self.pieces else [99]


def test_breakers_map_to_tokens_containing_them_or_ending_with_their_start():
    got = process_breakers(FakeTokenizer(), ["\n", "ab"])
    assert set(got) == {(1, ()), (5, ()), (0, (99,))}  # contain "\n", contain "ab", "a" + tail "b"
    assert dict(process_breakers(FakeTokenizer(), ["ay"])) == {0: (4,)}  # "a" + the tail "y"


def test_dynatemp_maps_normalised_entropy_to_temperature():
    flat, peaked = cands([0.25] * 4), cands([0.97, 0.01, 0.01, 0.01])
    out = temperature_ext(flat, 1.0, 0.5, 1.0)  # maximal entropy -> temp + range
    assert torch.allclose(out.logits, flat.logits / 1.5)
    p = torch.tensor([0.97, 0.01, 0.01, 0.01], dtype=torch.float64)
    norm = float(-(p * p.log()).sum()) / math.log(4)
    t = 0.5 + 1.0 * norm**2.0  # range [0.5, 1.5], exponent 2
    assert torch.allclose(temperature_ext(peaked, 1.0, 0.5, 2.0).logits, peaked.logits / t)


def test_mirostat_v2_truncates_by_surprise_and_updates_mu():
    state = SamplerState()
    c = cands([0.5, 0.25, 0.125, 0.125])  # surprises 1, 2, 3, 3 bits
    p = SamplingParams(mirostat=2, mirostat_tau=1.25, mirostat_eta=0.5)  # mu starts at 2 * tau = 2.5
    r = mirostat_v2(c.ids, c.logits, p, state, 0.9)
    assert sorted(r.ids.tolist()) == [0, 1]  # surprise <= mu
    chosen_p = {0: 2 / 3, 1: 1 / 3}[r.token]
    assert state.mu == pytest.approx(2.5 - 0.5 * (-math.log2(chosen_p) - 1.25))


def test_mirostat_mu_lives_in_the_sequence_across_steps():
    logits = torch.randn(1, 300, generator=torch.Generator().manual_seed(3)) * 3
    for version in (1, 2):
        rng, p = SequenceRng(11), SamplingParams(mirostat=version, mirostat_tau=3.0, mirostat_eta=0.2)
        mus = []
        for _ in range(3):
            Sampler(300).sample(logits, [p], [rng], [[]])
            mus.append(rng.state.mu)
        assert len(set(mus)) == 3 and SequenceRng(11).state.mu is None


# -- the chain --------------------------------------------------------------------------------

def post_probs(logits: torch.Tensor, **kw) -> dict[int, float]:
    p = SamplingParams(post_sampling_probs=True, n_probs=20, **kw)
    out = Sampler(logits.shape[0]).sample(logits[None], [p], [SequenceRng(0)], [[]])
    return {int(i): math.exp(float(lp)) for i, lp in zip(out.top_ids[0], out.top_logprobs[0]) if lp > -math.inf}


PROBS = torch.tensor([0.40, 0.25, 0.15, 0.10, 0.05, 0.03, 0.015, 0.005])


def test_order_changes_the_result_as_in_llama_cpp():
    base = dict(top_k=0, top_p=0.7, min_p=0.0, temperature=3.0)
    # default: top_p on the model's distribution keeps {0, 1, 2} (0.40 + 0.25 + 0.15 >= 0.7)
    assert set(post_probs(PROBS.log(), **base)) == {0, 1, 2}
    # temperature first flattens it, so top_p needs more tokens
    flat = (PROBS ** (1 / 3)) / (PROBS ** (1 / 3)).sum()
    n = int((flat.cumsum(0) < 0.7).sum()) + 1
    got = post_probs(PROBS.log(), samplers=["temperature", "top_p"], **base)
    assert set(got) == set(range(n)) and n > 3
    assert post_probs(PROBS.log(), samplers="tp", **base) == pytest.approx(got)  # letters, as llama-server


def test_full_chain_agrees_with_the_fast_path_on_the_common_samplers():
    for kw, kept in [(dict(top_k=3, top_p=1.0, min_p=0.0), 3), (dict(top_k=0, top_p=0.75, min_p=0.0), 3),
                     (dict(top_k=0, top_p=1.0, min_p=0.2), 4)]:
        want = PROBS[:kept] ** 0.5 / (PROBS[:kept] ** 0.5).sum()
        got = post_probs(PROBS.log(), temperature=2.0, **kw)
        assert got == pytest.approx({i: float(want[i]) for i in range(kept)}, abs=1e-5)


def test_post_sampling_probs_greedy_reports_one_token_with_probability_one():
    assert post_probs(PROBS.log(), temperature=0.0) == pytest.approx({0: 1.0})


def test_a_seed_reproduces_xtc_and_mirostat_whatever_else_is_in_the_batch():
    logits = torch.randn(4, 400, generator=torch.Generator().manual_seed(5)) * 2
    xtc_p = SamplingParams(xtc_probability=0.5, xtc_threshold=0.05, temperature=1.0, top_k=0)
    miro = SamplingParams(mirostat=2, temperature=1.0)
    others = [SamplingParams(), SamplingParams(temperature=0), SamplingParams(typical_p=0.9)]

    def run(batch: bool) -> list[tuple[int, int]]:
        rngs, out = [SequenceRng(7), SequenceRng(8)] + [SequenceRng(i) for i in range(3)], []
        for _ in range(6):
            params = [xtc_p, miro] + (others if batch else [])
            rows = torch.cat([logits[:2], logits[1:]]) if batch else logits[:2]
            t = Sampler(400).sample(rows, params, rngs[: len(params)], [[]] * len(params)).tokens
            out.append((int(t[0]), int(t[1])))
        return out

    assert run(True) == run(False)


# -- validation -------------------------------------------------------------------------------

@pytest.mark.parametrize(("field", "value"), [
    ("mirostat", 3), ("typical_p", 1.5), ("xtc_probability", 2.0), ("xtc_threshold", -0.1),
    ("adaptive_decay", 1.0), ("min_keep", -1), ("dry_allowed_length", -1), ("top_n_sigma", math.nan),
    ("post_sampling_probs", 1), ("dynatemp_exponent", math.inf),
])
def test_out_of_range_values_name_the_field(field, value):
    with pytest.raises(SamplingError, match=field):
        SamplingParams(**{field: value})


@pytest.mark.parametrize(("value", "want"), [
    ("kpt", ("top_k", "top_p", "temperature")),
    (["Top-K", "nucleus", "typ", "minp", "temp", "penalties", "dry", "xtc"],
     ("top_k", "top_p", "typ_p", "min_p", "temperature", "penalties", "dry", "xtc")),
])
def test_samplers_accept_llama_servers_names_and_letters(value, want):
    assert SamplingParams(samplers=value).samplers == want


def test_the_infill_sampler_is_named_as_llama_vim_names_it():
    assert SamplingParams(samplers=["top_k", "top_p", "infill"]).samplers == ("top_k", "top_p", "infill")
    assert SamplingParams(samplers="kpi").samplers == ("top_k", "top_p", "infill")


@pytest.mark.parametrize("value", ["kz", ["top_k", "bogus"], 3])
def test_unknown_or_unsupported_samplers_are_refused_by_name(value):
    with pytest.raises(SamplingError, match="samplers"):
        SamplingParams(samplers=value)


# -- request fields (llama-server's names) -----------------------------------------------------

def request_params(body: dict) -> SamplingParams:
    from slotserver.server.fields import Fields
    from slotserver.server.params import sampling_params
    from slotserver.server.config import GenerationDefaults

    return sampling_params(Fields(body), FakeTokenizer(), GenerationDefaults(), 0)


def test_request_fields_reach_the_sampler_with_llama_server_defaults():
    p = request_params({"mirostat": 2, "mirostat_tau": 4.0, "typical_p": 0.9, "xtc_probability": 0.5,
                        "dry_multiplier": 0.8, "dry_base": 0.5, "dry_sequence_breakers": ["\n", "ab"],
                        "samplers": "kt", "post_sampling_probs": True, "top_n_sigma": 1.5})
    assert (p.mirostat, p.mirostat_tau, p.typical_p, p.xtc_probability, p.top_n_sigma) == (2, 4.0, 0.9, 0.5, 1.5)
    assert p.dry_base == 1.75  # < 1 means the default, as in llama-server
    assert set(p.dry_breakers) == {(1, ()), (5, ()), (0, (99,))} and p.samplers == ("top_k", "temperature")
    assert p.post_sampling_probs and request_params({}).plain_chain


@pytest.mark.parametrize(("body", "field"), [
    ({"samplers": ["top_k", "bogus"]}, "bogus"), ({"samplers": "kq"}, "'q'"), ({"samplers": 5}, "samplers"),
    ({"mirostat": 3}, "mirostat"), ({"typical_p": 2}, "typical_p"), ({"xtc_threshold": -1}, "xtc_threshold"),
    ({"dry_sequence_breakers": []}, "dry_sequence_breakers"), ({"dry_allowed_length": -1}, "dry_allowed_length"),
    ({"post_sampling_probs": "yes"}, "post_sampling_probs"), ({"adaptive_decay": 1.0}, "adaptive_decay"),
])
def test_bad_sampler_fields_are_a_400_naming_them(body, field):
    from slotserver.server.errors import ApiError

    with pytest.raises(ApiError) as err:
        request_params(body)
    assert err.value.status == 400 and field in str(err.value)
