"""--cache-reuse N / `n_cache_reuse`: llama-server's chunk search, and at admission the reused chunks'
KV moved into place (K re-rotated) instead of computed again; `n_cached` counts them.

How outputs are compared: on a one-layer model (tests/shift_fixtures.py) a reused chunk's KV is
exactly what computing it at its new position gives, so a run with reuse must give a run without
reuse's tokens and their log-probabilities within 1e-4 (greedy, n_probs). With more layers the
reused KV keeps its old context, as in llama-server: only the counts are compared there.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from shift_fixtures import FLOAT_LAYOUTS, engine, events, run, write_variant
from shift_fixtures import one_torch_thread  # noqa: F401  (autouse)

from slotserver.engine.cache_reuse import find_chunks
from slotserver.engine.context_shift import Span
from slotserver.engine.request import Request
from slotserver.model.sampling.sampler import SamplingParams

P, X, Q, R, Y = (list(range(a, a + n)) for a, n in ((10, 10), (100, 10), (200, 20), (30, 5), (150, 3)))
GREEDY = SamplingParams(temperature=0, n_probs=1)


@pytest.fixture(scope="module")
def path(tmp_path_factory) -> Path:
    return write_variant(tmp_path_factory.mktemp("reuse"), "llama")


# -- the search, as llama-server's loop ---------------------------------------------------------------
@pytest.mark.parametrize("cached, prompt, n_min, want", [
    (P + X + Q, P + Q + R, 4, [Span(20, 10, 20)]),                         # Q moves down over X
    (P + X + Q, P + Q + R, 21, []),                                        # shorter than n_min
    (P + X + Q[:10] + Y + Q[10:], P + Q + R, 4, [Span(20, 10, 10), Span(33, 20, 10)]),  # two chunks
    (P + X[:2] + Q[:3] + Y + Q, P + Q, 4, [Span(18, 10, 20)]),             # a short match is skipped
    (P + Q, P + Q, 1, []),                                                 # all in the common prefix
    (P + X, P + Q, 1, []),                                                 # nothing matches
])
def test_chunks_are_found_as_llama_server_finds_them(cached, prompt, n_min, want):
    n_past = next(i for i, (a, b) in enumerate(zip(cached + [-1], prompt + [-2])) if a != b)
    assert find_chunks(cached, prompt, n_past, n_min) == want


# -- the engine ------------------------------------------------------------------------------------
def _second(path: Path, layout: str, first: list[int], second: list[int], server: int = 0, **fields):
    """`first` fills the slot's cache, then `second` runs on it; -> the second one's events."""
    e = engine(path, layout, n_parallel=1, ctx_size=128, cache_reuse=server)
    e.submit(Request(tuple(first), GREEDY, n_predict=1, ignore_eos=True))
    run(e)
    h = e.submit(Request(tuple(second), GREEDY, n_predict=8, ignore_eos=True, **fields))
    run(e)
    if hasattr(e.cache.layout, "check"):
        e.cache.layout.check()
    return events(h)


@pytest.mark.parametrize("layout", FLOAT_LAYOUTS)
def test_a_reused_chunk_gives_what_computing_it_gives(path, layout):
    tokens, logprobs, final = _second(path, layout, P + X + Q, P + Q + R, server=4)
    want_tokens, want_logprobs, want_final = _second(path, layout, P + X + Q, P + Q + R, cache_prompt=False)
    assert final.n_cached == len(P + Q) and want_final.n_cached == 0
    assert tokens == want_tokens and max(abs(a - b) for a, b in zip(logprobs, want_logprobs)) < 1e-4


def test_two_chunks_are_reused(path):
    tokens, logprobs, final = _second(path, "paged", P + X + Q[:10] + Y + Q[10:], P + Q + R, n_cache_reuse=4)
    want_tokens, want_logprobs, _ = _second(path, "paged", P + X + Q, P + Q + R, cache_prompt=False)
    assert final.n_cached == len(P + Q)
    assert tokens == want_tokens and max(abs(a - b) for a, b in zip(logprobs, want_logprobs)) < 1e-4


@pytest.mark.parametrize("server, field, cached", [
    (4, None, len(P + Q)),     # --cache-reuse 4
    (4, 0, len(P)),            # the request turns it off: the common prefix only
    (0, 4, len(P + Q)),        # the request turns it on
    (0, None, len(P)),         # off by default, as llama-server
    (21, None, len(P)),        # Q is 20 tokens: shorter than the least chunk
])
def test_the_request_field_overrides_the_server_flag(path, server, field, cached):
    fields = {} if field is None else {"n_cache_reuse": field}
    assert _second(path, "seq_head_dim", P + X + Q, P + Q + R, server=server, **fields)[2].n_cached == cached


def test_a_prompt_reused_whole_still_computes_its_last_token(path):
    """llama-server's TAG_PROMPT_LOGITS: one token is computed for the first logits."""
    tokens, logprobs, final = _second(path, "seq_head_dim", P + X + Q, P + Q, server=4)
    want_tokens, want_logprobs, _ = _second(path, "seq_head_dim", P + X + Q, P + Q, cache_prompt=False)
    assert final.n_cached == len(P + Q) - 1
    assert tokens == want_tokens and max(abs(a - b) for a, b in zip(logprobs, want_logprobs)) < 1e-4


def test_without_cache_prompt_nothing_is_reused(path):
    assert _second(path, "seq_head_dim", P + X + Q, P + Q + R, server=4, cache_prompt=False)[2].n_cached == 0


@pytest.mark.parametrize("store", ["ram", "disk"])
def test_a_slot_restored_from_the_prompt_cache_offers_its_chunks(path, tmp_path, store):
    """--cache-ram / --cache-disk: another prompt took the slot meanwhile; the cached entry comes back
    whole (as llama-server's prompt_load), so its chunks past the common prefix are still reused."""
    tier = {"cache_ram_mib": 64} if store == "ram" else {"cache_ram_mib": 0, "cache_disk": tmp_path / "kv"}
    e = engine(path, n_parallel=1, ctx_size=128, cache_reuse=4, **tier)
    for prompt in (P + X + Q, R + Y):
        e.submit(Request(tuple(prompt), GREEDY, n_predict=1, ignore_eos=True))
        run(e)
    if e.disk_cache is not None:
        e.disk_cache.flush()   # its writes are a background thread's
    h = e.submit(Request(tuple(P + Q + R), GREEDY, n_predict=8, ignore_eos=True))
    run(e)
    tokens, logprobs, final = events(h)
    want_tokens, want_logprobs, _ = _second(path, "seq_head_dim", P + X + Q, P + Q + R, cache_prompt=False)
    assert final.n_cached == len(P + Q)
    assert tokens == want_tokens and max(abs(a - b) for a, b in zip(logprobs, want_logprobs)) < 1e-4
