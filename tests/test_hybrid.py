"""A hybrid model (Qwen3.5: gated delta-net layers beside gated attention) in the engine.

The model's numbers are held to llama-server's in test_arch_fixtures.py (fixtures qwen35,
qwen35_eq: converted by llama.cpp's own converter). Here: what the engine does with the
recurrent states (engine/recurrent_policy.py, runtime/recurrent_state.py). Greedy, float32; the
oracle is each prompt alone through `generate`.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch
from starlette.testclient import TestClient

from slotserver.engine.config import EngineConfig
from slotserver.engine import slot_files
from slotserver.engine.engine import Engine
from slotserver.engine.speculative.config import SpecConfig
from slotserver.engine.request import Request, RequestError
from slotserver.errors import ConfigError, ModuleLoadError
from slotserver.model.bundle import ModelBundle
from slotserver.model.config import ModelConfig
from slotserver.model.generate import GenRequest, generate
from slotserver.model.model import LlamaModel
from slotserver.model.sampling.sampler import SamplingParams
from slotserver.model.weights import WeightFormat
from slotserver.runtime.batch import Batch, SeqChunk
from slotserver.runtime.kernel_set import KernelSet
from slotserver.runtime.kv_spec import KVSpec
from slotserver.runtime.layouts import create_layout, load_layout
from slotserver.server import ServerConfig, ServerState, create_app
from test_arch_fixtures import N_CTX, _prefilled
from test_engine import run_sync
from test_moe import q8_copy
from gguf_rewrite import rewrite

ARCHS = Path(__file__).parent / "fixtures" / "archs"
GREEDY = SamplingParams(temperature=0)


@pytest.fixture(scope="module")
def bundle():
    return ModelBundle.load(ModelConfig(model_path=ARCHS / "qwen35.gguf", dtype="float32"))


def alone(bundle, prompt: list[int], n: int) -> list[int]:
    return generate(bundle.model, [GenRequest(list(prompt), n, ignore_eos=True)], bundle.tokenizer.eog_ids)[0].tokens


def _prompts(seed: int, count: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, 300) for _ in range(rng.randrange(3, 30))] for _ in range(count)]


@pytest.mark.parametrize("name, layout, defrag", [("qwen35", "seq_head_dim", "on"), ("qwen35", "paged", "off"),
                                                  ("lfm2", "seq_head_dim", "on"), ("lfm2", "paged", "off"),
                                                  ("lfm2moe", "seq_head_dim", "on"), ("granitehybrid", "paged", "on"),
                                                  ("nemotron_h", "seq_head_dim", "on"),
                                                  ("nemotron_h_moe", "paged", "on"), ("falcon_h1", "seq_head_dim", "on")])
def test_batched_chunked_and_defragmented_sequences_match_each_alone(name, layout, defrag):
    """Seven requests on three slots arriving over time, prompts cut in chunks of 5 tokens: each
    sequence's state follows its stream through decode batches (on contiguous streams, and on
    scattered ones: defrag off), prefill chunks beside decodes, slot reuse and defrag moves (the
    scenario must move some). Qwen3.5's delta nets, LFM2's short convolutions (LFM2-MoE's with its
    experts) and Granite 4.0-H's Mamba-2 layers."""
    prompts, rng = _prompts(1, 7), random.Random(2)
    arrivals: dict[int, list[Request]] = {}
    for p in prompts:
        arrivals.setdefault(rng.randrange(0, 20), []).append(Request(tuple(p), GREEDY, n_predict=8, ignore_eos=True))
    order = [r for step in sorted(arrivals) for r in arrivals[step]]
    loaded = ModelBundle.load(ModelConfig(model_path=ARCHS / f"{name}.gguf", dtype="float32", layout=layout))
    engine = Engine(loaded, EngineConfig(n_parallel=3, ctx_size=192, ubatch_size=5, defrag=defrag))
    results = run_sync(engine, arrivals)
    for req, res in zip(order, results):
        assert res.tokens == alone(loaded, list(req.prompt_ids), 8)
    assert (engine.stats().defrag_moves > 0) == (defrag == "on")


@pytest.mark.parametrize("name", ["qwen35", "lfm2", "lfm2moe", "granitehybrid", "granitehybrid_dense", "nemotron_h",
                                  "nemotron_h_moe", "falcon_h1"])
def test_decode_steps_replay_from_step_graphs_with_the_eager_steps_tokens(name, tmp_path):
    """On GGUF blocks a hybrid decode step is C calls only (qmatmul, the recurrent layers'
    kernels/delta_net_step.py, short_conv_step.py or mamba2_step.py, Qwen3.5's attention gate, granite's
    multipliers and shared expert, Nemotron-H's squared ReLU): it is captured as a step graph and
    replayed. A capture runs the step twice, and the second run must start from the states the first
    advanced from (step_graph.capture's rewind): requests arriving over time, on
    three slots, give the tokens of the same engine with step graphs off."""
    path = q8_copy(ARCHS / f"{name}.gguf", tmp_path / "q8.gguf")
    loaded = ModelBundle.load(ModelConfig(model_path=path, dtype="auto"))
    if loaded.model.kernels.modules["delta_net_step"].module._LIB is None:
        pytest.skip("no C compiler (or SLOTSERVER_NATIVE=0): no C call to record")
    prompts, rng = _prompts(5, 5), random.Random(6)
    arrivals: dict[int, list[Request]] = {}
    for p in prompts:
        arrivals.setdefault(rng.randrange(0, 12), []).append(Request(tuple(p), GREEDY, n_predict=10, ignore_eos=True))
    results = {}
    for graphs in (True, False):
        loaded.model.set_step_graphs(graphs)
        engine = Engine(loaded, EngineConfig(n_parallel=3, ctx_size=192))
        results[graphs] = [r.tokens for r in run_sync(engine, arrivals)]
        if graphs:
            assert loaded.model.graphs.graphs, "no decode step was captured"
    assert results[True] == results[False]


@pytest.mark.parametrize("checkpoints", [8, 0])
def test_a_next_turn_continues_the_slots_state_and_a_diverging_prompt_resumes_at_a_checkpoint(bundle, checkpoints):
    """A prompt that extends all of the slot's cached tokens (prompt + answer: a chat's next turn)
    computes only its new tokens. One sharing only part of them (the live state is past that part),
    and one equal to them (its last token is computed again for logits), resume at the latest
    checkpoint within the shared part (4 tokens before an earlier prompt's end, --ctx-checkpoints),
    or at 0 without checkpoints. Every answer is the one computed alone."""
    engine = Engine(bundle, EngineConfig(n_parallel=1, ctx_size=128, ubatch_size=8, ctx_checkpoints=checkpoints))
    first = [17, 40, 99, 120, 5, 66, 210, 13]
    (a,) = run_sync(engine, {0: [Request(tuple(first), GREEDY, n_predict=6, ignore_eos=True)]})
    cached = first + a.tokens[:-1]                       # the last token was sampled, never computed
    follow = first + a.tokens + [44, 45, 46]
    (b,) = run_sync(engine, {0: [Request(tuple(follow), GREEDY, n_predict=6, ignore_eos=True)]})
    assert b.final.n_cached == len(cached) and b.tokens == alone(bundle, follow, 6)
    diverging = follow[:10] + [7, 8, 9]                  # shares 10: the first prompt's checkpoint is at 4
    (c,) = run_sync(engine, {0: [Request(tuple(diverging), GREEDY, n_predict=6, ignore_eos=True)]})
    assert c.final.n_cached == (4 if checkpoints else 0) and c.tokens == alone(bundle, diverging, 6)
    again = diverging + c.tokens[:-1]                    # exactly the slot's cached tokens
    (d,) = run_sync(engine, {0: [Request(tuple(again), GREEDY, n_predict=4, ignore_eos=True)]})
    assert d.final.n_cached == (len(diverging) - 4 if checkpoints else 0) and d.tokens == alone(bundle, again, 4)
    assert engine.cache.bytes_used() > engine.cache.layout.bytes_used()   # the states and checkpoints count


def test_siblings_of_one_prompt_each_compute_it(bundle):
    """n > 1: a sibling does not copy its parent's prompt KV (the parent's state is past it) and
    still gives the same greedy answer."""
    engine = Engine(bundle, EngineConfig(n_parallel=2, ctx_size=128))
    prompt = (30, 31, 32, 33, 200, 201)
    parent = engine.submit(Request(prompt, GREEDY, n_predict=5, ignore_eos=True))
    sibling = engine.submit(Request(prompt, GREEDY, n_predict=5, ignore_eos=True), parent=parent)
    while engine.step():
        pass
    want, (p, s) = alone(bundle, list(prompt), 5), (h.result(timeout=0) for h in (parent, sibling))
    assert p.tokens == want and s.tokens == want and s.final.n_cached == 0


@pytest.mark.parametrize("flags, name", [
    (dict(context_shift=True), "--context-shift"), (dict(cache_reuse=16), "--cache-reuse"),
    (dict(async_steps="on"), "--async-steps"), (dict(cache_disk=Path("/nonexistent")), "--cache-disk"),
    (dict(spec=SpecConfig(types=("ngram-simple",))), "--spec-type")])
def test_what_a_recurrent_state_cannot_follow_is_refused_at_start(bundle, flags, name):
    with pytest.raises(ConfigError, match=f"{name}.*recurrent layers"):
        Engine(bundle, EngineConfig(n_parallel=1, ctx_size=128, **flags))


@pytest.mark.parametrize("action", ["save", "restore"])
def test_slot_files_are_refused(bundle, tmp_path, action):
    """/slots?action=save|restore (a RequestError is HTTP 400): their files would hold no state."""
    engine = Engine(bundle, EngineConfig(n_parallel=1, ctx_size=128, slot_save_path=tmp_path))
    with pytest.raises(RequestError, match="slot save and restore are not supported: the model has recurrent"):
        getattr(slot_files, action)(engine, 0, "a.bin")


def test_a_stream_is_never_continued_from_a_state_that_does_not_match(bundle):
    """The model itself refuses to continue a stream anywhere but where its state stands (or at 0)."""
    model = bundle.model
    cache = create_layout(load_layout("seq_head_dim"), KVSpec(model.spec.n_kv_layers, 2, 64, model.spec.n_kv_heads,
                                                                model.spec.head_dim))
    model.forward(Batch.build([SeqChunk(0, 0, [5, 6, 7, 8, 9])]), cache)
    stale = "stream 0: a recurrent model cannot continue at position 3: its state holds 5 tokens"
    with pytest.raises(RuntimeError, match=stale):
        model.forward(Batch.build([SeqChunk(0, 3, [10])]), cache)
    with pytest.raises(RuntimeError, match="stream 1: .* continue at position 2: its state holds 0 tokens"):
        model.forward(Batch.build([SeqChunk(1, 2, [10])]), cache)
    model.forward(Batch.build([SeqChunk(0, 5, [10]), SeqChunk(1, 0, [1, 2])]), cache)   # where it stands, or anew


def test_kv_is_kept_for_the_attention_layers_only(bundle):
    spec = bundle.model.spec
    assert spec.recurrent.layers == (True, True, True, False) and spec.kv_layers == (3,) and spec.n_kv_layers == 1


def test_a_q8_0_file_on_blocks_gives_llama_servers_probabilities(tmp_path):
    """The fixture with its matrices in Q8_0 (test_moe.q8_copy), served as GGUF blocks: the fused
    in-projection (q|k|v, z, beta, alpha) and the gated q through qmatmul. llama-server's top-8 on the same
    file (tests/fixtures/hybrid/qwen35_q8.json, recorded 2026-11-28): within 0.04 (0.029 measured; a
    last-bit change in either server's 8-bit rounding moves it). Both quantize the activations to 8
    bits, which this random model amplifies: the same file dequantized to float32 is 0.22 away from
    llama-server's."""
    path = q8_copy(ARCHS / "qwen35.gguf", tmp_path / "q8.gguf")
    rows = json.loads((Path(__file__).parent / "fixtures" / "hybrid" / "qwen35_q8.json").read_text())
    model = LlamaModel.load(path, torch.float32, max_pos=N_CTX, fmt=WeightFormat("q"))
    if model.kernels.modules["qmatmul"].module._LIB is None:
        pytest.skip("8-bit activations on the blocks need the C kernels (SLOTSERVER_NATIVE=0 or no compiler)")
    assert {type(lw.qkv).__name__ for lw in model.weights.layers} == {"QLinear"}
    worst = 0.0
    for lp, r in zip(_prefilled(model, rows), rows):
        lp = lp.log_softmax(-1)
        for i, step in enumerate(r["steps"]):
            ids, want = torch.tensor([t for t, _ in step["top"]]), torch.tensor([p for _, p in step["top"]]).exp()
            worst = max(worst, float((lp[i, ids].exp() - want).abs().max()))
    assert worst < 0.04   # 0.029 measured


def test_through_http_the_same_prompt_again_resumes_at_its_checkpoint_and_slot_files_are_400(bundle, tmp_path):
    """/completion twice with one prompt: the second computes only the 4 tokens after the first's
    checkpoint (timings.cache_n) and answers the same; /slots save is a 400 naming the reason."""
    engine = Engine(bundle, EngineConfig(n_parallel=1, ctx_size=128, slot_save_path=tmp_path)).start()
    state = ServerState(ServerConfig(model_path=str(bundle.config.model_path), slot_save_path=tmp_path))
    state.set_loaded(bundle, engine)
    try:
        with TestClient(create_app(state)) as client:
            body = {"prompt": "the quick brown fox jumps", "n_predict": 6, "temperature": 0}
            first, again = (client.post("/completion", json=body).json() for _ in range(2))
            n = first["timings"]["prompt_n"]
            assert first["timings"]["cache_n"] == 0 and again["timings"]["cache_n"] == n - 4 and n > 8
            assert again["content"] == first["content"] and again["timings"]["prompt_n"] == 4
            r = client.post("/slots/0?action=save", json={"filename": "s.bin"})
            assert r.status_code == 400 and "recurrent layers" in r.json()["error"]["message"]
    finally:
        engine.stop()


def test_tensor_parallel_refuses_a_hybrid_model(bundle):
    from slotserver.parallel.shard import ShardError, ShardPlan
    with pytest.raises(ShardError, match="--tp 2: qwen35's recurrent layers are not split across ranks"):
        ShardPlan.make(bundle.model, 2)


def test_a_remapped_stream_drops_the_checkpoints_of_its_earlier_tokens(bundle):
    """Defrag gives a slot another stream without a move when it has nothing to carry: that stream's
    old checkpoints are another prompt's and must not serve the new one (the review found one
    restored onto unrelated tokens: wrong answers, no error). Its own checkpoints serve it."""
    engine = Engine(bundle, EngineConfig(n_parallel=2, ctx_size=128, ubatch_size=64))
    first, second = [11 + i for i in range(10)], [200 + i for i in range(20)]   # checkpoints at 6 and 16
    for prompt in (first, second):
        run_sync(engine, {0: [Request(tuple(prompt), GREEDY, n_predict=3, ignore_eos=True)]})
    assert engine.sched.streams.stream_of[1] == 0   # the second slot took the first one's old stream
    short, long = second[:10] + [50, 51, 52, 53], second[:18] + [50, 51]        # share 10 and 18 tokens
    (c,) = run_sync(engine, {0: [Request(tuple(short), GREEDY, n_predict=5, ignore_eos=True)]})
    assert c.final.n_cached == 0 and c.tokens == alone(bundle, short, 5)          # not the first's 6
    run_sync(engine, {0: [Request(tuple(second), GREEDY, n_predict=3, ignore_eos=True)]})
    (d,) = run_sync(engine, {0: [Request(tuple(long), GREEDY, n_predict=5, ignore_eos=True)]})
    assert d.final.n_cached == 16 and d.tokens == alone(bundle, long, 5)


def test_a_kernel_rolled_back_mid_step_reruns_the_step_from_the_states_before_it(bundle):
    """A kernel just swapped in fails inside a step, after the delta-net layers have moved their
    states: the lab serves the previous kernels and the step runs again from the states as they
    were before it, so every answer is still the one computed alone."""
    engine = Engine(bundle, EngineConfig(n_parallel=2, ctx_size=128))
    prompts = [[30 + i for i in range(12)], [90 + i for i in range(7)]]
    handles = [engine.submit(Request(tuple(p), GREEDY, n_predict=6, ignore_eos=True)) for p in prompts]
    for _ in range(3):
        engine.step()                                    # prompts in, decoding under way
    good = bundle.model.kernels
    engine.lab._previous_kernels, bundle.model.kernels = good, _FailingFfn(good)   # as a swap leaves them
    try:
        while engine.step():
            pass
    finally:
        failing, bundle.model.kernels = bundle.model.kernels, good   # the module's bundle serves other tests
    assert failing is good
    for h, p in zip(handles, prompts):
        assert h.result(timeout=0).tokens == alone(bundle, p, 6)


class _FailingFfn:
    """A kernel set whose silu_mul fails: the first FFN, after layer 0's delta net, raises."""

    def __init__(self, inner) -> None:
        self._inner = inner

    def __getattr__(self, name: str):
        if name == "silu_mul":
            raise RuntimeError("a broken silu_mul")
        return getattr(self._inner, name)


def test_lora_adapters_and_hybrid_draft_models_are_refused(bundle, tmp_path):
    from slotserver.model.lora import LoraError, _target
    with pytest.raises(LoraError, match="adapters on a hybrid model .qwen35. are not supported"):
        _target("blk.3.attn_q.weight", bundle.model.spec, tmp_path / "a.gguf")
    target = ModelBundle.load(ModelConfig(model_path=ARCHS / "qwen3.gguf", dtype="float32"))
    spec = SpecConfig(types=("draft-simple",), draft_model=ARCHS / "qwen35.gguf")
    with pytest.raises(ConfigError, match="the draft model cannot be a hybrid model"):
        Engine(target, EngineConfig(n_parallel=1, ctx_size=128, spec=spec), draft=bundle)




@pytest.mark.parametrize("key, value, message", [
    ("lfm2.attention.causal", False, "a non-causal lfm2 .an embedding model. is not supported"),
    ("lfm2.shortconv.l_cache", 1, "shortconv.l_cache 1 must be at least 2")])
def test_lfm2_files_this_server_would_misread_are_refused_in_one_line(tmp_path, key, value, message):
    import gguf
    from slotserver.model.gguf_file import GGUFError
    vtype = gguf.GGUFValueType.BOOL if isinstance(value, bool) else gguf.GGUFValueType.UINT32
    path = rewrite(ARCHS / "lfm2.gguf", tmp_path / "m.gguf", keys={key: (value, vtype)})
    with pytest.raises(GGUFError, match=message):
        LlamaModel.load(path)


@pytest.mark.parametrize("name, op", [("qwen35", "delta_net_step"), ("lfm2", "short_conv_step"),
                                      ("granitehybrid", "mamba2_step")])
def test_a_kernel_set_without_the_recurrent_kernel_is_refused_at_load(name, op):
    """A lab folder copied before the recurrent layers' kernels existed: one line at load naming it,
    not a failed first step."""
    full = KernelSet.load()
    partial = KernelSet({k: m for k, m in full.modules.items() if k != op})
    with pytest.raises(ModuleLoadError, match=f"{name}.gguf: a {name} model needs the kernel {op}"):
        LlamaModel.load(ARCHS / f"{name}.gguf", kernels=partial)


def test_a_mamba2_file_with_flat_small_tensors_gives_the_same_logits(tmp_path):
    """ssm_a, ssm_d and ssm_norm written flat (llama-quantize writes a one-group ssm_norm so) load as
    the [heads, 1] / [groups, inner / groups] forms llama.cpp declares: the same logits."""
    def flat(name, data, qtype):
        return (data.reshape(-1), qtype) if name.endswith(("ssm_a", "ssm_d", "ssm_norm.weight")) else (data, qtype)
    src = ARCHS / "granitehybrid.gguf"
    dst = rewrite(src, tmp_path / "flat.gguf", tensors=flat)
    prompt = [SeqChunk(0, 0, [5, 17, 200, 33, 1, 90], all_logits=True)]
    want, got = (_prefilled_logits(LlamaModel.load(p, torch.float32), prompt) for p in (src, dst))
    assert torch.equal(want, got)


def _prefilled_logits(model: LlamaModel, chunks: list[SeqChunk]) -> torch.Tensor:
    s = model.spec
    cache = create_layout(load_layout("seq_head_dim"), KVSpec(s.n_kv_layers, 1, 32, s.n_kv_heads, s.head_dim,
                                                                torch.float32))
    return model.forward(Batch.build(chunks), cache)
