"""Context shift (--context-shift): llama-server's n_keep / n_discard arithmetic, the exact KV move
(cells moved down, K re-rotated with the model's own RoPE) on every layout, and what a client sees:
a generation longer than its slot gets its n_predict tokens, `truncated: true`, every token counted.

How exactness is checked (see tests/shift_fixtures.py): on one-layer models a shift must equal a
fresh prefill of the kept tokens at their new positions (float32 layouts: logits within 1e-4); on
the multi-layer arch fixtures (per-layer tables, yarn, longrope, windows) the re-rotated keys must
equal the model's own RoPE applied at the new positions. q8 re-quantizes the moved rows, so it gets
its own bound (one quantization more).
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from shift_fixtures import (FLOAT_LAYOUTS, VARIANTS, engine, events, fresh_logits, load_model, new_cache, prefill,
                            run, write_variant)
from shift_fixtures import one_torch_thread  # noqa: F401  (autouse)
from gguf import GGUFValueType
from gguf_rewrite import rewrite

from slotserver.engine.context_shift import ContextShift, KVShift, Span
from slotserver.engine.kv_shift import apply_shift
from slotserver.engine.config import EngineConfig
from slotserver.engine.engine import Engine
from slotserver.engine.request import ContextExceeded, Request
from slotserver.errors import ConfigError
from slotserver.model.bundle import ModelBundle
from slotserver.model.config import ModelConfig
from slotserver.model.rope_shift import rotate_keys
from slotserver.model.sampling.sampler import SamplingParams
from slotserver.runtime.loader import default_dir

ARCHS = Path(__file__).parent / "fixtures" / "archs"
TOKENS = torch.randint(3, 300, (60,), generator=torch.Generator().manual_seed(1)).tolist()
KEEP, DISCARD, NEXT = 5, 20, 77


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("shift")


# -- llama-server's arithmetic ----------------------------------------------------------------------
def _seq(n_keep=0, n_discard=0, num_prompt=20, num_computed=255):
    return SimpleNamespace(request=SimpleNamespace(n_keep=n_keep, n_discard=n_discard), num_prompt=num_prompt,
                           num_computed=num_computed)


@pytest.mark.parametrize("add_bos, fields, want", [
    (False, {}, (0, 127)),                                 # n_discard 0: half of n_left = 255
    (True, {}, (1, 127)),                                  # BOS: one token more kept
    (False, {"n_keep": -1}, (20, 117)),                    # -1: the whole prompt
    (True, {"n_keep": -1, "num_prompt": 250}, (251, 2)),   # n_keep <= n_ctx - 4 = 252
    (False, {"n_keep": 1000}, (252, 1)),
    (False, {"n_discard": 10}, (0, 10)),
    (False, {"n_discard": 500}, (0, 254)),                 # clamped to n_left - 1
    (False, {"n_keep": 3, "n_discard": 7}, (3, 7)),
])
def test_n_keep_and_n_discard_follow_llama_server(add_bos, fields, want):
    assert ContextShift(256, add_bos).sizes(_seq(**fields)) == want


# -- the KV move ------------------------------------------------------------------------------------
@pytest.mark.parametrize("case", sorted(p.stem for p in ARCHS.glob("*.gguf")))
def test_rotated_keys_equal_the_models_rope_at_the_new_positions(case):
    """Every layer's own table (gemma's windowed layers have their own base), yarn's mscale kept once."""
    model = load_model(ARCHS / f"{case}.gguf")
    s, gen = model.spec, torch.Generator().manual_seed(0)
    x = torch.randn(s.n_layers, 40, s.n_kv_heads, s.head_dim, generator=gen)   # keys before RoPE
    pos = torch.randint(0, 200, (40,), generator=gen)
    delta = torch.randint(-200, 50, (40,), generator=gen).clamp(min=-pos)
    rope, tables = model.kernels.rope, model.layer_ropes
    stored = torch.stack([rope(x[i], *tables[i].lookup(pos)) for i in range(s.n_layers)])
    want = torch.stack([rope(x[i], *tables[i].lookup(pos + delta)) for i in range(s.n_layers)])
    torch.testing.assert_close(rotate_keys(model, stored, delta), want, atol=1e-5, rtol=1e-5)


def _shifted_logits(model, layout: str) -> torch.Tensor:
    cache = new_cache(model, layout)
    prefill(model, cache, 1, 0, TOKENS)
    n_moved = len(TOKENS) - KEEP - DISCARD
    apply_shift(cache, model, KVShift(1, (Span(KEEP + DISCARD, KEEP, n_moved),), KEEP + n_moved))
    return prefill(model, cache, 1, KEEP + n_moved, [NEXT])


def _kept() -> list[int]:
    return TOKENS[:KEEP] + TOKENS[KEEP + DISCARD:] + [NEXT]


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("layout", FLOAT_LAYOUTS)
def test_after_a_shift_the_next_logits_equal_a_fresh_prefill_of_the_kept_tokens(folder, layout, variant):
    model = load_model(write_variant(folder, variant))
    got, want = _shifted_logits(model, layout), fresh_logits(model, layout, _kept())
    assert (got - want).abs().max().item() < 1e-4


@pytest.mark.parametrize("layout", ["seq_head_dim", "paged"])
def test_a_latent_attention_shift_equals_a_fresh_prefill(tmp_path, layout):
    """deepseek2's cache row holds its rotated key first, then the latent (mla_attention.py): a shift
    re-rotates exactly that part. One layer (deepseek2's leading dense layer alone, YaRN on)."""
    path = rewrite(ARCHS / "deepseek2.gguf", tmp_path / "one_layer.gguf", {"deepseek2.block_count": (1, GGUFValueType.UINT32)},
                   lambda n, d, t: None if n.startswith(("blk.1.", "blk.2.")) else (d, t))
    model = load_model(path)
    got, want = _shifted_logits(model, layout), fresh_logits(model, layout, _kept())
    assert (got - want).abs().max().item() < 1e-4


@pytest.mark.parametrize("variant", VARIANTS)
def test_q8_shift_costs_one_quantization_more(folder, variant):
    """q8 stores the re-rotated rows quantized again: its error stays of the size of q8's own."""
    model = load_model(write_variant(folder, variant))
    exact = fresh_logits(model, "seq_head_dim", _kept())
    own = (fresh_logits(model, "q8", _kept()) - exact).abs().max().item()
    assert (_shifted_logits(model, "q8") - exact).abs().max().item() <= 3 * own


def test_paged_shift_gives_blocks_back_and_leaves_a_sharing_stream_alone(folder):
    model = load_model(write_variant(folder, "llama"))
    cache = new_cache(model, "paged")
    prefill(model, cache, 0, 0, TOKENS)                       # 60 cells: 4 blocks of 16
    cache.layout.copy_stream(0, 1, len(TOKENS))               # stream 1 shares them
    before = cache.export_stream(0, len(TOKENS))
    apply_shift(cache, model, KVShift(1, (Span(KEEP + DISCARD, KEEP, 35),), 40))
    cache.layout.check()
    assert all(torch.equal(a, b) for a, b in zip(before, cache.export_stream(0, len(TOKENS))))
    assert cache.layout.blocks.alloc.n_used == 4 + 3          # stream 1 wrote its own copies (copy-on-write)
    cache.layout.free_stream(0)
    assert cache.layout.blocks.alloc.n_used == 3              # 40 cells: 3 blocks, the 4th went back
    assert (prefill(model, cache, 1, 40, [NEXT]) - fresh_logits(model, "paged", _kept())).abs().max() < 1e-4


# -- the engine ------------------------------------------------------------------------------------
PROMPT = tuple(range(40, 60))
N_CELLS = 32   # ctx_size 64 over 2 slots


def _oracle(model, prompt, chosen: list[int], n_keep: int) -> tuple[list[float], list[int]]:
    """One-layer oracle: before each token, prefill the tokens the slot holds from scratch, shifting as
    llama-server does (n_discard: half of the rest); -> (log-probability of each chosen token, the
    tokens held at the end)."""
    held, out = list(prompt), []
    for token in chosen:
        logits = fresh_logits(model, "seq_head_dim", held)
        out.append(torch.log_softmax(logits.double(), -1)[token].item())
        if len(held) + 1 >= N_CELLS:
            drop = (len(held) - n_keep) // 2
            held = held[:n_keep] + held[n_keep + drop:]
        held.append(token)
    return out, held[:-1]


@pytest.mark.parametrize("layout, defrag", [(name, "on") for name in FLOAT_LAYOUTS] + [("seq_head_dim", "off")])
def test_generation_past_the_slot_matches_an_oracle_that_recomputes_the_kept_tokens(folder, layout, defrag):
    """Two concurrent requests, several shifts each, seeded sampling: every token's probability is the
    oracle's (within 1e-4); n_predict tokens, truncated, the prompt counted whole."""
    path = write_variant(folder, "llama")
    e = engine(path, layout, n_parallel=2, ctx_size=2 * N_CELLS, defrag=defrag, context_shift=True)
    sampling = SamplingParams(temperature=1.0, seed=7, n_probs=1)   # n_probs: each token's log-probability
    handles = [e.submit(Request(PROMPT, sampling, n_predict=50, ignore_eos=True, n_keep=3)),     # 3 shifts
               e.submit(Request(PROMPT[:9], sampling, n_predict=40, ignore_eos=True, n_keep=-1))]  # 2 shifts
    run(e)
    model = load_model(path)
    for h, n_keep in zip(handles, (3, 9)):
        tokens, logprobs, final = events(h)
        assert len(tokens) == final.n_predicted == h.request.n_predict and final.truncated
        assert final.n_prompt == len(h.request.prompt_ids) and final.stop_type == "limit"
        want, _ = _oracle(model, h.request.prompt_ids, tokens, n_keep)
        assert max(abs(a - b) for a, b in zip(logprobs, want)) < 1e-4
    if hasattr(e.cache.layout, "check"):
        e.cache.layout.check()   # paged: no block leaked, refcounts right


def test_after_a_shift_the_slot_caches_what_its_kv_holds(folder):
    """The next request starting with the held tokens reuses all of them, and computes the same."""
    path = write_variant(folder, "llama")
    e = engine(path, n_parallel=1, ctx_size=N_CELLS, context_shift=True)
    h = e.submit(Request(PROMPT, SamplingParams(temperature=1.0, seed=3), n_predict=30, ignore_eos=True, n_keep=2))
    run(e)
    tokens, _, final = events(h)
    assert final.truncated and e.stats().prompt_tokens == len(PROMPT)   # decodes after a shift are no prompt
    _, held = _oracle(load_model(path), PROMPT, tokens, 2)
    h = e.submit(Request(tuple(held) + (NEXT,), SamplingParams(temperature=0, n_probs=1), n_predict=1))
    run(e)
    tokens, logprobs, final = events(h)
    assert final.n_cached == len(held) and not final.truncated
    want = torch.log_softmax(fresh_logits(load_model(path), "seq_head_dim", held + [NEXT]).double(), -1)
    assert abs(logprobs[0] - want[tokens[0]].item()) < 1e-4


def test_without_context_shift_a_full_slot_ends_the_request(folder):
    e = engine(write_variant(folder, "llama"), n_parallel=2, ctx_size=2 * N_CELLS)
    h = e.submit(Request(PROMPT, SamplingParams(temperature=0), n_predict=100, ignore_eos=True))
    run(e)
    tokens, _, final = events(h)
    assert len(tokens) == final.n_predicted == N_CELLS - len(PROMPT) and final.truncated


def test_a_prompt_that_fills_the_slot_is_refused_with_context_shift_on(folder):
    """As llama-server: context shift never truncates a prompt ("exceeds the available context size")."""
    e = engine(write_variant(folder, "llama"), n_parallel=2, ctx_size=2 * N_CELLS, context_shift=True)
    with pytest.raises(ContextExceeded, match="exceeds the available context size"):
        e.submit(Request(tuple(range(40, 40 + N_CELLS)), n_predict=4))


def test_without_n_predict_generation_goes_on_past_many_slots(folder):
    """n_predict -1 and context shift: no limit (llama-server's has_budget), until the client cancels."""
    e = engine(write_variant(folder, "llama"), n_parallel=2, ctx_size=2 * N_CELLS, context_shift=True)
    h = e.submit(Request(PROMPT, SamplingParams(temperature=1.0, seed=1), n_predict=-1, ignore_eos=True))
    for _ in range(5 * N_CELLS):
        e.step()
    h.cancel()
    run(e)
    tokens, _, final = events(h)
    assert len(tokens) >= 4 * N_CELLS and final.stop_type == "none" and final.truncated


def test_a_deeper_model_shifts_too_and_counts_every_token(folder, tmp_path):
    """Two layers (a shift keeps K/V computed with the dropped tokens in context, as llama-server):
    the tokens before the first shift are a no-shift run's, then generation goes on to n_predict."""
    from tiny_gguf import write_tiny_gguf

    path = write_tiny_gguf(tmp_path / "two.gguf", n_layers=2, ctx_len=256)
    prompt, greedy = tuple(range(70, 90)), SamplingParams(temperature=0)
    e = engine(path, n_parallel=1, ctx_size=N_CELLS, context_shift=True)
    h = e.submit(Request(prompt, greedy, n_predict=40, ignore_eos=True))
    run(e)
    long = engine(path, n_parallel=1, ctx_size=128)
    ref = long.submit(Request(prompt, greedy, n_predict=40, ignore_eos=True))
    run(long)
    (tokens, _, final), (want, _, _) = events(h), events(ref)
    assert len(tokens) == final.n_predicted == 40 and final.truncated
    assert tokens[: N_CELLS - len(prompt)] == want[: N_CELLS - len(prompt)]


def test_a_layout_that_cannot_move_keys_refuses_context_shift_at_startup(folder, tmp_path):
    source = (default_dir("layouts") / "seq_head_dim.py").read_text()
    (tmp_path / "frozen.py").write_text(source.replace('NAME = "seq_head_dim"', 'NAME = "frozen"\nKV_SHIFT = False'))
    path = write_variant(folder, "llama")
    bundle = ModelBundle.load(ModelConfig(model_path=path, layout="frozen", layouts_dir=tmp_path))
    for flags in ({"context_shift": True}, {"cache_reuse": 4}):
        with pytest.raises(ConfigError, match="declares that its keys cannot be moved"):
            Engine(bundle, EngineConfig(n_parallel=1, ctx_size=N_CELLS, **flags))
    Engine(bundle, EngineConfig(n_parallel=1, ctx_size=N_CELLS))   # without them it serves
