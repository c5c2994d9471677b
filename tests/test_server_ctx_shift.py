"""End to end: `slotserver serve --context-shift --cache-reuse 4` as a process, llama-server's requests.

A one-layer tiny model (tests/shift_fixtures.py), float32 (K/V too), one slot of 32 cells, no RAM
prompt cache (it would restore whole prompts and hide the chunk reuse): a completion longer than the
slot gets all its tokens and `truncated: true`; a prompt whose middle was cached at another position
reuses it (`timings.cache_n`) and answers what it answers when nothing is reused (log-probabilities
within 1e-4: on one layer a moved chunk's KV is exactly what computing it gives).
"""

from __future__ import annotations

import pytest
from shift_fixtures import write_variant
from test_server_e2e import Server, serving

P, X, Q, R = (list(range(a, a + n)) for a, n in ((10, 6), (100, 5), (200, 12), (30, 4)))


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ctx")
    with serving(tmp, "-m", str(write_variant(tmp, "llama")), "-np", "1", "-c", "32", "--context-shift",
                 "--cache-reuse", "4", "--cache-ram", "0", "--dtype", "float32", "--no-watch", "--no-warmup",
                 "-t", "1") as srv:
        yield srv


def complete(server: Server, prompt: list[int], n: int, **extra) -> dict:
    body = {"prompt": prompt, "n_predict": n, "temperature": 0, "ignore_eos": True, "return_tokens": True,
            "n_probs": 1, **extra}
    r = server.post("/completion", body)
    assert r.status_code == 200, r.text
    return r.json()


def test_a_completion_longer_than_the_slot_is_generated_whole(server):
    prompt = list(range(40, 60))
    body = complete(server, prompt, 70, n_keep=2, n_discard=5, cache_prompt=False)
    assert body["truncated"] is True and body["stop_type"] == "limit" and len(body["tokens"]) == 70
    assert (body["timings"]["prompt_n"], body["timings"]["predicted_n"], body["tokens_evaluated"]) == (20, 70, 20)


def test_a_moved_chunk_is_reused_and_answers_the_same(server):
    complete(server, P + X + Q, 1)
    plain = complete(server, P + Q + R, 6, n_cache_reuse=0)   # this request: no chunk reuse
    assert plain["timings"]["cache_n"] == len(P)
    complete(server, P + X + Q, 1)
    reused = complete(server, P + Q + R, 6)                    # the server's --cache-reuse 4
    assert reused["timings"]["cache_n"] == len(P + Q) and reused["timings"]["prompt_n"] == len(R)
    assert reused["tokens"] == plain["tokens"] and reused["truncated"] is False
    lps = [[p["logprob"] for p in (plain, reused)[k]["completion_probabilities"]] for k in (0, 1)]
    assert max(abs(a - b) for a, b in zip(*lps)) < 1e-4


@pytest.mark.parametrize("field", ["n_cache_reuse", "n_discard"])
def test_negative_shift_fields_are_refused(server, field):
    r = server.post("/completion", {"prompt": "hi", "n_predict": 1, field: -1})
    assert r.status_code == 400 and field in r.json()["error"]["message"]

