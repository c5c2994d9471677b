"""Paged layouts keep their promise: the block pool grows with the tokens held and shrinks when
they go, the engine gives seq_head_dim's tokens (greedy, float32) with a context far larger than
what it holds, and with a capped pool requests wait for free blocks (or a running one is
preempted and recomputed) instead of failing. The engine's KV cache makes the paged calls (budget,
trims, freeing a move's source) for paged layouts only."""

from __future__ import annotations

import random

import pytest
import torch
from tiny_gguf import write_tiny_gguf

from slotserver.model.bundle import ModelBundle
from slotserver.model.config import ModelConfig
from slotserver.engine.engine import Engine
from slotserver.engine.config import EngineConfig
from slotserver.engine.kv_cache import KVCache
from slotserver.engine.stream_map import Move
from slotserver.runtime.kv_spec import KVSpec
from slotserver.runtime.layouts import create_layout, load_layout
from slotserver.runtime.paged_contract import KVBudget
from slotserver.engine.request import Request
from slotserver.model.sampling.sampler import SamplingParams

GREEDY = SamplingParams(temperature=0)
PAGED = ["paged", "paged_hnd"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return write_tiny_gguf(tmp_path_factory.mktemp("pm") / "tiny.gguf", n_layers=2, ctx_len=8192)


def _layout(name: str, spec: KVSpec):
    return create_layout(load_layout(name), spec)


def _fill(lay, stream: int, n: int, value: float) -> torch.Tensor:
    rows = torch.full((n, 1, 4), value) + torch.arange(n).view(n, 1, 1) / 1000
    lay.write(0, torch.full((n,), stream), torch.arange(n), rows, -rows)
    return rows


@pytest.mark.parametrize("name", PAGED)
def test_pool_bytes_follow_the_cells_held_and_data_survives_shrinking(name):
    spec = KVSpec(n_layers=1, n_streams=8, n_cells=4096, n_kv_heads=1, head_dim=4)
    lay = _layout(name, spec)
    flat = spec.n_streams * spec.n_cells * spec.bytes_per_cell
    empty = lay.bytes_used()
    assert empty < flat / 50, "nothing held: the pool must not be preallocated"
    _fill(lay, 0, 3000, 1.0)
    small = _fill(lay, 1, 40, 2.0)          # its blocks sit above stream 0's
    held = lay.bytes_used()
    assert 3040 * spec.bytes_per_cell <= held - empty <= 2 * 3040 * spec.bytes_per_cell + empty
    lay.free_stream(0)                       # the pool shrinks: stream 1's blocks move down
    lay.check()
    assert lay.bytes_used() < held / 10
    torch.testing.assert_close(lay.export_stream(1, 40)[0][0], small)
    lay.free_stream(1)
    assert lay.bytes_used() == empty and lay.blocks.alloc.n_used == 0
    again = _fill(lay, 2, 3000, 3.0)         # and grows again
    torch.testing.assert_close(lay.export_stream(2, 3000)[0][0], again)
    assert lay.bytes_used() >= 3000 * spec.bytes_per_cell
    lay.check()


@pytest.mark.parametrize("name", PAGED + ["seq_head_dim"])
def test_the_kv_cache_makes_paged_calls_for_paged_layouts_only(name):
    """Paged: a budget from the layout's block size and pool limit, a defrag move's source freed, a
    trim gives blocks back. Flat: no budget, the source keeps its cells, a trim changes nothing."""
    spec = KVSpec(n_layers=1, n_streams=3, n_cells=64, n_kv_heads=1, head_dim=4, pool_cells=128)
    cache = KVCache(load_layout(name), spec)
    rows = _fill(cache.layout, 0, 40, 1.0)
    cache.apply([Move(0, 1, 40)])
    cache.trim(1, 1)
    held = {s: cache.export_stream(s, 40)[0][0] for s in (0, 1)}
    if not cache.paged:
        assert cache.budget() is None
        torch.testing.assert_close(held[0], rows)
        torch.testing.assert_close(held[1], rows)
        return
    size = cache.layout.block_size
    assert cache.budget() == KVBudget(size, 128 // size)
    assert not held[0].any(), "a move's source is freed"
    torch.testing.assert_close(held[1][:size], rows[:size])
    assert not held[1][size:].any(), "the trim kept the first block only"
    cache.layout.check()


def _run(engine: Engine, reqs, watch=None) -> list[list[int]]:
    handles = [engine.submit(Request(p, GREEDY, n_predict=n, ignore_eos=True)) for p, n in reqs]
    for _ in range(5000):
        if not engine.step():
            break
        if watch is not None:
            watch(engine)
    return [h.result(timeout=0).tokens for h in handles]


def _engine(tiny, layout: str, ctx: int, n_parallel: int = 4, pool: int | None = None) -> Engine:
    b = ModelBundle.load(ModelConfig(model_path=tiny, layout=layout))
    return Engine(b, EngineConfig(n_parallel=n_parallel, ctx_size=ctx, ubatch_size=64, kv_pool_cells=pool))


def _requests(seed: int, n: int, prompt: tuple[int, int], predict: tuple[int, int]):
    rng = random.Random(seed)
    return [(tuple(rng.randrange(3, 300) for _ in range(rng.randrange(*prompt))), rng.randrange(*predict))
            for _ in range(n)]


@pytest.mark.parametrize("name", PAGED)
def test_engine_memory_follows_tokens_with_a_large_context(tiny, name):
    reqs = _requests(1, 4, (150, 250), (20, 40))
    want = _run(_engine(tiny, "seq_head_dim", 4 * 2048), reqs)
    engine = _engine(tiny, name, 4 * 2048)
    flat = engine.config.n_streams * engine.config.n_cells * engine.cache.spec.bytes_per_cell
    peak = []
    assert _run(engine, reqs, lambda e: peak.append(e.cache.bytes_used())) == want
    assert max(peak) < flat / 4, "4 x ~230 tokens held of 5 x 2048 cells"
    busy = engine.cache.bytes_used()
    _run(engine, [((7, 8), 1)] * 4)          # new prompts take every slot: old caches are trimmed
    assert engine.cache.bytes_used() < busy / 2
    engine.cache.layout.check()


@pytest.mark.parametrize("name", PAGED)
def test_admission_waits_for_free_blocks(tiny, name):
    """A pool of 256 cells (16 blocks): requests of ~150 tokens (+ a decode block) need 10 blocks
    each, so they run one at a time while the others wait; all finish with the same tokens."""
    reqs = _requests(2, 4, (130, 150), (10, 20))
    want = _run(_engine(tiny, "seq_head_dim", 4 * 256), reqs)
    engine = _engine(tiny, name, 4 * 256, pool=256)
    running, waiting = [], []
    got = _run(engine, reqs, lambda e: (running.append(len(e.sched.running())), waiting.append(len(e.sched.waiting))))
    assert got == want
    assert max(running) == 1 and max(waiting) == 3 and engine.cache.layout.max_blocks == 16
    assert engine.cache.layout.blocks.alloc.capacity <= 16
    engine.cache.layout.check()


@pytest.mark.parametrize("name", PAGED)
def test_decode_past_the_pool_preempts_and_recomputes(tiny, name):
    """Two requests admitted together outgrow a 256-cell pool while decoding: the one with the
    least progress is preempted, recomputed later, and both give seq_head_dim's tokens."""
    reqs = [(tuple(range(10, 50)), 150), (tuple(range(60, 90)), 150)]
    want = _run(_engine(tiny, "seq_head_dim", 2 * 256, n_parallel=2), reqs)
    engine = _engine(tiny, name, 2 * 256, n_parallel=2, pool=256)
    seen = []
    assert _run(engine, reqs, lambda e: seen.append((len(e.sched.running()), len(e.sched.waiting)))) == want
    assert seen[0] == (2, 0), "both admitted together"
    assert (1, 1) in seen, "one was preempted back to the queue while the other ran on"
    assert engine.cache.layout.blocks.alloc.capacity <= 16
    engine.cache.layout.check()


def test_a_pool_smaller_than_one_slot_is_refused(tiny):
    with pytest.raises(ValueError, match="cannot hold one full stream"):
        _engine(tiny, "paged", 4 * 256, pool=100)
