"""--cache-ram: a slot's KV survives another prompt taking the slot (host memory), and a request
restores its longest cached prefix into whatever slot it lands on; the answer is the one computed
from scratch, and the restored tokens are reported as cached (llama-server's prompt cache)."""

from __future__ import annotations

import pytest
import torch

from slotserver.engine.config import EngineConfig
from slotserver.engine.engine import Engine
from slotserver.engine.prompt_cache import MIN_SHARED, PromptCache
from slotserver.engine.request import Request
from slotserver.errors import ConfigError
from slotserver.model.bundle import ModelBundle
from slotserver.model.config import ModelConfig
from slotserver.model.sampling.params import SamplingParams
from tiny_gguf import write_tiny_gguf

LONG = tuple(range(5, 45))
OTHER = (200, 201, 202, 203, 204, 205)


def _run(engine: Engine, prompt, id_slot: int = -1):
    req = Request(prompt, SamplingParams(temperature=0.0), n_predict=4, ignore_eos=True, id_slot=id_slot)
    return engine.submit(req).result(60)


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    return ModelBundle.load(ModelConfig(write_tiny_gguf(tmp_path_factory.mktemp("pc") / "t.gguf", ctx_len=512),
                                        threads=1, layout="paged"))


@pytest.mark.parametrize("unified", [False, True])
def test_a_prefix_pushed_out_of_its_slot_comes_back_from_ram(bundle, unified):
    config = EngineConfig(n_parallel=2, ctx_size=256, cache_ram_mib=16, kv_unified=unified,
                          kv_pool_cells=128 if unified else None)
    engine = Engine(bundle, config).start()
    try:
        first = _run(engine, LONG, id_slot=0)
        _run(engine, OTHER, id_slot=0)              # slot 0's LONG KV moves to the RAM cache
        again = _run(engine, LONG, id_slot=1)       # another slot: restored from RAM, not recomputed
        assert again.tokens == first.tokens
        assert again.final.n_cached == len(LONG) - 1 and engine.prompt_cache.hits >= 1
        if unified:   # idle slots were saved and cleared when a request started: only the running one held KV
            assert engine.sched.slots.slots[0].cached == []
    finally:
        engine.stop()


def test_hit_rates_count_what_came_from_a_cache(bundle):
    """Per slot and in all (what /slots, /lab and `top` show): prompt tokens reused against computed,
    and the RAM cache's entries, bytes and hits."""
    from slotserver.server.routes.slots import slot_json

    engine = Engine(bundle, EngineConfig(n_parallel=2, ctx_size=256, cache_ram_mib=16)).start()
    try:
        _run(engine, LONG, id_slot=0)                      # 40 computed
        _run(engine, OTHER, id_slot=0)                     # 6 computed; LONG's KV to RAM
        again = _run(engine, LONG, id_slot=1)              # 39 from RAM, 1 computed
        stats = engine.stats()
        s0, s1 = stats.slots
        assert (s0.prompt_cached, s0.prompt_computed) == (0, len(LONG) + len(OTHER))
        assert (s1.prompt_cached, s1.prompt_computed) == (again.final.n_cached, len(LONG) - again.final.n_cached)
        assert stats.prompt_tokens_cached == len(LONG) - 1 and stats.ram_cache_hits == 1
        assert stats.ram_cache_entries >= 1 and stats.ram_cache_bytes > 0
        assert slot_json(s1, None)["prompt_cache"] == {"n_cached": 39, "n_computed": 1, "hit_rate": 0.975}
    finally:
        engine.stop()


def _drive(engine: Engine, arrivals: dict[int, list[Request]]) -> list:
    """The engine stepped on this thread, requests submitted at the given steps (deterministic)."""
    handles, step = [], 0
    while step < 500:
        handles += [engine.submit(r) for r in arrivals.get(step, [])]
        if not engine.step() and step > max(arrivals):
            break
        step += 1
    return [h.result(timeout=0) for h in handles]


def _req(prompt, n=4, id_slot=-1, cache_prompt=True):
    return Request(prompt, SamplingParams(temperature=0.0), n_predict=n, ignore_eos=True, id_slot=id_slot,
                   cache_prompt=cache_prompt)


@pytest.mark.parametrize("layout", ["paged", "head_seq_dim"])
def test_a_prefix_held_by_another_slot_is_copied_not_recomputed(tmp_path, layout):
    """Without a RAM cache: a prompt sharing a long prefix with another slot's KV (idle, or busy
    generating) starts from a copy of it, and answers as the same prompt computed from scratch."""
    bundle = ModelBundle.load(ModelConfig(write_tiny_gguf(tmp_path / "t.gguf", ctx_len=512), threads=1,
                                          layout=layout))
    longer = LONG + (100, 101, 102)
    fresh = _drive(Engine(bundle, EngineConfig(n_parallel=3, ctx_size=384)), {0: [_req(longer, cache_prompt=False)]})
    eng = Engine(bundle, EngineConfig(n_parallel=3, ctx_size=384))
    idle = _drive(eng, {0: [_req(LONG, id_slot=0)], 40: [_req(longer, id_slot=1)]})   # slot 0 idle by then
    assert idle[1].final.n_cached == len(LONG) and idle[1].tokens == fresh[0].tokens
    assert eng.sched.hooks.shared == 1 and eng.prompt_cache is None
    eng = Engine(bundle, EngineConfig(n_parallel=3, ctx_size=384))
    busy = _drive(eng, {0: [_req(LONG, n=40, id_slot=0)], 3: [_req(longer, id_slot=1)]})   # slot 0 decoding
    assert busy[1].final.n_cached == len(LONG) and busy[1].tokens == fresh[0].tokens
    alone = _drive(Engine(bundle, EngineConfig(n_parallel=3, ctx_size=384)), {0: [_req(LONG, n=40)]})[0]
    assert busy[0].tokens == alone.tokens   # the slot copied from went on undisturbed
    short = LONG[: MIN_SHARED - 1] + (250,)   # too short a prefix to be worth a copy
    eng = Engine(bundle, EngineConfig(n_parallel=3, ctx_size=384))
    assert _drive(eng, {0: [_req(LONG, id_slot=0)], 40: [_req(short, id_slot=1)]})[1].final.n_cached == 0


def test_concurrent_prompts_with_one_prefix_compute_it_once(tmp_path):
    """Four requests sharing a long prefix arrive together: the first computes it, the others wait
    for that prefill and start from a copy (paged: the same blocks), and each answers as it would
    alone."""
    bundle = ModelBundle.load(ModelConfig(write_tiny_gguf(tmp_path / "t.gguf", ctx_len=512), threads=1,
                                          layout="paged"))
    prefix = tuple(range(5, 205))
    prompts = [prefix + (100 + i, 101 + i) for i in range(4)]
    eng = Engine(bundle, EngineConfig(n_parallel=4, ctx_size=1024, batch_size=64, ubatch_size=64))
    together = _drive(eng, {0: [_req(p, n=3) for p in prompts]})
    assert [r.final.n_cached for r in together] == [0, len(prefix), len(prefix), len(prefix)]
    assert eng.sched.hooks.shared == 3
    alone = [_drive(Engine(bundle, EngineConfig(n_parallel=4, ctx_size=1024)), {0: [_req(p, n=3)]})[0] for p in prompts]
    assert [r.tokens for r in together] == [r.tokens for r in alone]


def test_without_ram_cache_the_prefix_is_recomputed(bundle):
    engine = Engine(bundle, EngineConfig(n_parallel=2, ctx_size=256)).start()
    try:
        first = _run(engine, LONG, id_slot=0)
        _run(engine, OTHER, id_slot=0)
        again = _run(engine, LONG, id_slot=1)
        assert again.tokens == first.tokens and again.final.n_cached == 0 and engine.prompt_cache is None
    finally:
        engine.stop()


def test_the_cache_evicts_least_recently_used_by_bytes():
    kv = torch.zeros(2, 4, 2, 8)                       # 512 bytes each for K and V
    cache = PromptCache(limit_bytes=2048)
    assert cache.save((1, 2, 3), kv, kv) and cache.save((4, 5), kv, kv)
    assert cache.best((1, 2, 9))[2] == 2              # (1, 2, 3) used last now
    cache.save((7,), kv, kv)                           # over 2048: (4, 5) goes
    assert (4, 5) not in cache and (1, 2, 3) in cache and cache.bytes == 2048
    assert not PromptCache(limit_bytes=100).save((1,), kv, kv)   # larger than the whole cache
    with pytest.raises(ConfigError, match="--cache-ram"):
        EngineConfig(cache_ram_mib=-2)
