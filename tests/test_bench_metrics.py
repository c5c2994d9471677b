"""`slotserver bench`'s pure parts: metric arithmetic on scripted records, arrivals, prompts, config.

Records are built by hand with known chunk times (dyadic fractions, so differences are exact),
and every expected number is worked out by hand in the test, following `vllm bench serve`:
TTFT = first chunk - start, TPOT = (E2E - TTFT) / (tokens - 1), ITL = chunk gaps, throughputs over
completed requests only.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from slotserver.bench.config import BenchConfig, ConfigError
from slotserver.bench.dataset import build_prompts, file_prompts, load_prompt_file, random_prompts
from slotserver.bench.metrics import MAX_ERRORS, compute_metrics, percentile
from slotserver.bench.record import RequestRecord
from slotserver.bench.runner import arrival_offsets


def ok(index, start, chunks, end, reported=None, input_tokens=16):
    """A successful record; `chunks` is [(time, tokens in chunk or None)]."""
    r = RequestRecord(index=index, prompt_tokens=input_tokens, start=start)
    for t, n in chunks:
        r.add_chunk(t, n)
    r.reported_output = reported
    r.finish(end)
    assert r.success
    return r


def failed(index, message, start=0.0, chunks=()):
    r = RequestRecord(index=index, prompt_tokens=16, start=start)
    for t in chunks:
        r.add_chunk(t, 1)
    r.fail(message)
    return r


def test_one_request_ttft_tpot_itl_e2e_exactly():
    # 4 one-token chunks: first at +0.5 s, then +0.25, +0.25, +0.5; the stream closes at +1.75 s.
    r = ok(0, 100.0, [(100.5, 1), (100.75, 1), (101.0, 1), (101.5, 1)], 101.75)
    m = compute_metrics([r], duration_s=2.0)
    assert m.ttft.mean_ms == 500.0
    assert m.e2el.mean_ms == 1750.0
    assert m.tpot.mean_ms == pytest.approx((1750.0 - 500.0) / 3)   # first token excluded
    assert m.itl.count == 3 and m.itl.mean_ms == pytest.approx((250 + 250 + 500) / 3)
    assert m.itl.median_ms == 250.0
    assert (m.completed, m.failed, m.total_output_tokens, m.total_input_tokens) == (1, 0, 4, 16)
    assert m.output_throughput == 2.0 and m.total_token_throughput == 10.0 and m.request_throughput == 0.5


def test_multi_token_chunks_count_tokens_for_tpot_and_chunks_for_itl():
    # 3 chunks carrying 1, 3 and 2 tokens: 6 output tokens, 2 inter-chunk gaps.
    r = ok(0, 0.0, [(0.25, 1), (0.5, 3), (1.0, 2)], 1.25)
    m = compute_metrics([r], duration_s=1.25)
    assert m.total_output_tokens == 6
    assert m.tpot.mean_ms == pytest.approx((1250 - 250) / 5)
    assert m.itl.count == 2 and m.itl.mean_ms == pytest.approx((250 + 500) / 2)


def test_server_reported_token_count_wins_over_chunk_count():
    # OpenAI chunks do not say how many tokens they hold; usage said 8 for these 4 chunks.
    r = ok(0, 0.0, [(0.5, None), (1.0, None), (1.5, None), (2.0, None)], 2.0, reported=8)
    m = compute_metrics([r], duration_s=2.0)
    assert m.total_output_tokens == 8
    assert m.tpot.mean_ms == pytest.approx(1500 / 7)
    assert m.itl.count == 3


def test_single_output_token_has_no_tpot_but_counts_elsewhere():
    single = ok(0, 0.0, [(0.5, 1)], 0.75)
    m = compute_metrics([single], duration_s=1.0)
    assert m.tpot.count == 0 and m.tpot.mean_ms is None and m.tpot.p99_ms is None
    assert m.itl.count == 0
    assert m.ttft.mean_ms == 500.0 and m.e2el.mean_ms == 750.0 and m.completed == 1
    two = ok(1, 0.0, [(0.25, 1), (0.5, 1)], 0.5)
    assert compute_metrics([single, two], duration_s=1.0).tpot.count == 1


def test_mean_median_std_p99_over_requests():
    # TTFTs 100, 200, 300, 400, 1000 ms -> mean 400, median 300, population std sqrt(100000),
    # p99 at rank 0.99 * 4 = 3.96: 400 + 0.96 * (1000 - 400) = 976.
    recs = [ok(i, 0.0, [(t / 1000, 1)], t / 1000 + 0.5) for i, t in enumerate([300, 100, 1000, 200, 400])]
    s = compute_metrics(recs, duration_s=2.0).ttft
    assert s.count == 5
    assert s.mean_ms == pytest.approx(400.0)
    assert s.median_ms == pytest.approx(300.0)
    assert s.std_ms == pytest.approx(math.sqrt(100000.0))
    assert s.p99_ms == pytest.approx(976.0)


def test_failures_are_counted_with_messages_and_kept_out_of_every_average():
    good = [ok(0, 0.0, [(0.5, 1), (1.0, 1)], 1.0), ok(2, 0.0, [(0.25, 1), (0.5, 1)], 0.75)]
    # A failure that did stream a token late: its TTFT (3 s) must not reach the statistics.
    bad = [failed(1, "HTTP 503: Loading model"), failed(3, "the stream ended before data: [DONE]",
                                                        chunks=[3.0])]
    m = compute_metrics(good + bad, duration_s=4.0)
    assert (m.completed, m.failed) == (2, 2)
    assert m.errors == ("HTTP 503: Loading model", "the stream ended before data: [DONE]")
    assert dict(m.error_counts) == {"HTTP 503: Loading model": 1, "the stream ended before data: [DONE]": 1}
    assert m.ttft.mean_ms == pytest.approx(375.0) and m.ttft.count == 2
    assert m.total_input_tokens == 32 and m.total_output_tokens == 4
    assert m.request_throughput == 0.5            # 2 completed / 4 s, not 4 sent / 4 s
    assert m.output_throughput == 1.0 and m.total_token_throughput == 9.0


def test_all_failed_gives_no_statistics_and_errors_capped_in_index_order():
    recs = [failed(i, f"error {i}") for i in reversed(range(MAX_ERRORS + 3))]
    m = compute_metrics(recs, duration_s=1.0)
    assert (m.completed, m.failed, m.total_output_tokens, m.output_throughput) == (0, MAX_ERRORS + 3, 0, 0.0)
    assert all(s.mean_ms is None for s in (m.ttft, m.tpot, m.itl, m.e2el))
    assert m.errors == tuple(f"error {i}" for i in range(MAX_ERRORS))
    same = compute_metrics([failed(i, "HTTP 503: busy") for i in range(4)], duration_s=1.0)
    assert same.error_counts == (("HTTP 503: busy", 4),)


def test_a_stream_without_tokens_is_a_failure():
    r = RequestRecord(index=0, start=0.0)
    r.finish(1.0)
    assert not r.success and "without any generated token" in r.error


@given(st.lists(st.floats(0, 1e4, allow_nan=False), min_size=1, max_size=50), st.floats(0, 100))
def test_percentile_matches_numpy_linear(values, p):
    assert percentile(values, p) == pytest.approx(float(np.percentile(values, p)), rel=1e-9, abs=1e-9)


def test_request_rate_inf_releases_everything_at_once():
    assert arrival_offsets(5, math.inf, 1.0, seed=0) == [0.0] * 5


@pytest.mark.parametrize("burstiness", [0.25, 1.0, 4.0])
def test_arrival_gaps_have_mean_one_over_rate_and_gamma_spread(burstiness):
    offsets = arrival_offsets(20001, 8.0, burstiness, seed=3)
    gaps = np.diff(offsets)
    assert offsets[0] == 0.0 and (gaps >= 0).all()
    assert gaps.mean() == pytest.approx(1 / 8.0, rel=0.05)
    # Gamma(shape=b): coefficient of variation 1/sqrt(b); Poisson (b=1) has CV 1.
    assert gaps.std() / gaps.mean() == pytest.approx(1 / math.sqrt(burstiness), rel=0.05)
    assert arrival_offsets(50, 8.0, burstiness, seed=3) == offsets[:50]   # seeded
    assert arrival_offsets(50, 8.0, burstiness, seed=4) != offsets[:50]


def test_random_prompts_are_exact_length_in_vocab_and_seeded():
    prompts = random_prompts(4, input_len=16, vocab_size=50, seed=7)
    assert all(len(p.wire()) == 16 and p.n_tokens == 16 for p in prompts)
    assert all(0 <= t < 50 for p in prompts for t in p.wire())
    assert prompts == random_prompts(4, 16, 50, seed=7) != random_prompts(4, 16, 50, seed=8)
    # Warm-up prompts are drawn after the measured ones: adding some changes nothing measured.
    assert build_prompts(6, 16, 7, vocab_size=50)[:4] == prompts


def test_prompt_file_is_cycled_and_bad_files_are_named(tmp_path):
    good = tmp_path / "p.json"
    good.write_text(json.dumps(["a", "b"]))
    assert [p.wire() for p in file_prompts(load_prompt_file(good), 5)] == ["a", "b", "a", "b", "a"]
    for body in ("{}", "[]", '["ok", 3]', '["ok", ""]', "not json"):
        bad = tmp_path / "bad.json"
        bad.write_text(body)
        with pytest.raises(ConfigError, match="bad.json"):
            load_prompt_file(bad)


@pytest.mark.parametrize("field, value", [
    ("backend", "tgi"), ("base_url", "localhost:8080"), ("input_len", 0), ("num_prompts", -1),
    ("max_concurrency", 0), ("request_rate", 0.0), ("request_rate", math.nan), ("burstiness", 0.0),
    ("warmup", -1), ("temperature", -0.5), ("timeout_s", 0.0), ("output_len", 2.5)])
def test_config_refuses_bad_values_naming_the_flag(field, value):
    with pytest.raises(ConfigError, match=f"--{field.split('_')[0]}"):
        BenchConfig(**{field: value})


def test_config_json_has_inf_rate_and_no_api_key():
    cfg = BenchConfig(base_url="http://h:1/", api_key="secret")
    out = cfg.to_json()
    assert out["request_rate"] == "inf" and "api_key" not in out and out["base_url"] == "http://h:1"
    assert "secret" not in json.dumps(out)
