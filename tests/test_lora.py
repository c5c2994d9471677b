"""LoRA adapters (model/lora.py, engine/lora_scales.py, server/routes/lora.py): a model serving an
adapter computes what the model with the adapter merged into its weights computes.

The reference does not use the code under test: tiny_lora.merge writes W + s * alpha/r * B A into a
second model file, which loads as any model does.
"""

from __future__ import annotations

import pytest
import torch
from starlette.testclient import TestClient

from shift_fixtures import events, run
from tiny_gguf import tiny_vocab, tiny_weights, write_tiny_gguf
from tiny_lora import layer_names, merge, random_pairs, write_adapter

from slotserver.cli.main import build_parser
from slotserver.engine.config import EngineConfig
from slotserver.engine.engine import Engine
from slotserver.engine.kv_cache import KVCache
from slotserver.engine.prompt_cache import PromptCache
from slotserver.engine.request import Request, RequestError
from slotserver.model.bundle import ModelBundle
from slotserver.model.config import ConfigError, ModelConfig, lora_flags
from slotserver.model import lora_delta
from slotserver.model.lora import LoraError, LoraSet, read_adapter
from slotserver.model.model import LlamaModel
from slotserver.model.sampling.params import SamplingParams
from slotserver.model.text.chat_template import ChatTemplate
from slotserver.runtime.batch import Batch, SeqChunk
from slotserver.runtime.kv_spec import KVSpec
from slotserver.server import ServerConfig, ServerState, create_app

ARCHS = {   # llama: separate q/k/v, untied output; qwen2: neox rope (q/k rows reordered), biases; phi3: fused
    "llama": dict(arch="llama", tied_embeddings=False),
    "qwen2": dict(arch="qwen2", qkv_bias=True),
    "phi3": dict(arch="phi3", features=("fused",)),
}
TOKENS = [5, 77, 300, 12, 9, 41, 250, 3]


def _pairs(kw: dict, output: bool = False, seed: int = 1) -> dict:
    w = tiny_weights(vocab_size=len(tiny_vocab()[0]), **{k: v for k, v in kw.items() if k not in ("arch", "tensor_type")})
    fused = "fused" in kw.get("features", ())
    targets = ("attn_qkv", "attn_output", "ffn_up", "ffn_down") if fused else None
    names = layer_names(2, targets, output) if targets else layer_names(2, output=output)
    return random_pairs(w, names, seed=seed)


def _files(tmp_path, kw: dict, scale: float, alpha: float = 0.0, output: bool = False):
    pairs = _pairs(kw, output)
    base = write_tiny_gguf(tmp_path / "base.gguf", **kw)
    merged = write_tiny_gguf(tmp_path / "merged.gguf", transform=merge(pairs, scale, alpha), **kw)
    return base, merged, write_adapter(tmp_path / "lora.gguf", kw["arch"], pairs, alpha)


def _logits(model: LlamaModel, chunks: list[SeqChunk]) -> torch.Tensor:
    s, dev = model.spec, model.device
    cache = KVCache.create("seq_head_dim", KVSpec(s.n_layers, 2, 64, s.n_kv_heads, s.head_dim, torch.float32, device=dev))
    return model.forward(Batch.build(chunks, dev), cache).cpu()


def _prompt(stream: int, lora: tuple = (), tokens=TOKENS) -> SeqChunk:
    return SeqChunk(stream, 0, list(tokens), all_logits=True, prompt=True, lora=lora)


def _with_adapter(base, adapter) -> LlamaModel:
    model = LlamaModel.load(base, torch.float32)
    model.lora = LoraSet([read_adapter(adapter, model.spec, model.spec.arch)], model.spec)
    return model


@pytest.mark.parametrize("arch", ARCHS)
def test_an_adapter_gives_the_merged_models_logits(tmp_path, arch):
    kw = ARCHS[arch]
    base, merged, adapter = _files(tmp_path, kw, 0.7, output=arch == "llama")
    model = _with_adapter(base, adapter)
    want = _logits(LlamaModel.load(merged, torch.float32), [_prompt(0)])
    got = _logits(model, [_prompt(0, (0.7,))])
    plain = _logits(LlamaModel.load(base, torch.float32), [_prompt(0)])
    assert (want - plain).abs().max() > 0.5                       # the adapter changes the answer
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    assert torch.equal(_logits(model, [_prompt(0, (0.0,))]), plain)   # scale 0: the base model exactly


def test_prefill_chunks_past_the_c_rows_take_torchs_deltas(tmp_path):
    """Over lora_delta.MAX_ROWS rows the unfused body adds torch's deltas: the same answer."""
    base, merged, adapter = _files(tmp_path, ARCHS["llama"], 0.7, output=True)
    tokens = list(range(30, 30 + lora_delta.MAX_ROWS + 8))
    want = _logits(LlamaModel.load(merged, torch.float32), [_prompt(0, (), tokens)])
    got = _logits(_with_adapter(base, adapter), [_prompt(0, (0.7,), tokens)])
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_alpha_scales_by_alpha_over_rank(tmp_path):
    base, merged, adapter = _files(tmp_path, ARCHS["llama"], 0.5, alpha=8.0)   # rank 4: factor 2
    want = _logits(LlamaModel.load(merged, torch.float32), [_prompt(0)])
    torch.testing.assert_close(_logits(_with_adapter(base, adapter), [_prompt(0, (0.5,))]), want, rtol=1e-4, atol=1e-4)


def test_rows_of_one_step_each_get_their_requests_adapters(tmp_path):
    """A step mixing a request with the adapter and one without: each row as alone (to float32
    rounding: the matmuls run on 13 rows instead of 8 or 5)."""
    base, merged, adapter = _files(tmp_path, ARCHS["qwen2"], 1.0)
    model, ref, plain = _with_adapter(base, adapter), LlamaModel.load(merged, torch.float32), LlamaModel.load(base, torch.float32)
    got = _logits(model, [_prompt(0, (1.0,)), _prompt(1, (), TOKENS[:5])])
    torch.testing.assert_close(got[: len(TOKENS)], _logits(ref, [_prompt(0)]), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(got[len(TOKENS):], _logits(plain, [_prompt(1, (), TOKENS[:5])]), rtol=1e-5, atol=1e-5)


def test_gguf_blocks_with_an_adapter_are_within_quantization_of_the_merged_model(tmp_path):
    """The default CPU serving path (Q8_0 blocks, the fused qmatmul; the deltas in C on these 8 rows).
    The reference merges the adapter into the blocks' own (dequantized) weights, in float32."""
    import gguf
    from gguf import GGMLQuantizationType as QT
    from tiny_gguf import quantize
    kw = dict(ARCHS["llama"], tensor_type=QT.Q8_0)
    pairs = _pairs(kw)
    base = write_tiny_gguf(tmp_path / "base.gguf", **kw)
    adapter = write_adapter(tmp_path / "lora.gguf", "llama", pairs)

    def as_blocks(weights):   # every 2-D weight as the Q8_0 file holds it, then the deltas
        out = {k: gguf.quants.dequantize(quantize(w, QT.Q8_0), QT.Q8_0).reshape(w.shape) if w.ndim == 2 else w
               for k, w in weights.items()}
        return merge(pairs, 1.0)(out)
    merged = write_tiny_gguf(tmp_path / "merged.gguf", transform=as_blocks, **ARCHS["llama"])
    model = ModelBundle.load(ModelConfig(base, weights="q", threads=1, lora=((adapter, 1.0),))).model
    want = _logits(LlamaModel.load(merged, torch.float32), [_prompt(0)])
    got = _logits(model, [_prompt(0, (1.0,))])
    plain, plain_f32 = _logits(model, [_prompt(0)]), _logits(LlamaModel.load(base, torch.float32), [_prompt(0)])
    activations = (plain - plain_f32).abs().mean()      # what qmatmul's q8 activations cost alone (0 in torch)
    assert (got - want).abs().mean() < 2 * activations + 1e-5
    assert (plain - want).abs().mean() > 0.5


def test_generate_applies_the_adapters_scales(tmp_path):
    """`slotserver generate --lora`'s path (model/generate.py): greedy tokens of the merged model."""
    from slotserver.model.generate import GenRequest, generate
    base, merged, adapter = _files(tmp_path, ARCHS["qwen2"], 0.8)
    req = dict(prompt_ids=TOKENS, n_predict=12)
    want = generate(LlamaModel.load(merged, torch.float32), [GenRequest(**req)], frozenset())[0].tokens
    plain = generate(LlamaModel.load(base, torch.float32), [GenRequest(**req)], frozenset())[0].tokens
    got = generate(_with_adapter(base, adapter), [GenRequest(**req, lora=(0.8,)), GenRequest(**req)], frozenset())
    assert want != plain and [r.tokens for r in got] == [want, plain]


def _bad(tmp_path, arch="llama", **change) -> str:
    pairs = _pairs(ARCHS["llama"])
    for name, value in change.items():
        pairs[name.replace("__", ".")] = value
    pairs = {k: v for k, v in pairs.items() if v is not None}
    path = write_adapter(tmp_path / "bad.gguf", arch, pairs)
    model = LlamaModel.load(write_tiny_gguf(tmp_path / "base.gguf", **ARCHS["llama"]), torch.float32)
    with pytest.raises(LoraError) as e:
        read_adapter(path, model.spec, "llama")
    return str(e.value)


def test_adapters_that_do_not_fit_the_model_are_refused_by_name(tmp_path):
    assert "general.architecture is 'qwen2'" in _bad(tmp_path, arch="qwen2")
    a, b = _pairs(ARCHS["llama"])["blk.0.attn_q.weight"]
    assert "blk.0.attn_q.weight has lora_a (4, 64) and lora_b (32, 4)" in _bad(tmp_path, blk__0__attn_q__weight=(a, b[:32]))
    assert "blk.7.attn_q.weight is no matmul" in _bad(tmp_path, blk__7__attn_q__weight=(a, b))
    assert "token_embd.weight is no matmul" in _bad(tmp_path, token_embd__weight=(a, b))
    tied = write_tiny_gguf(tmp_path / "tied.gguf")
    path = write_adapter(tmp_path / "out.gguf", "llama", {"output.weight": _pairs(ARCHS["llama"], True)["output.weight"]})
    with pytest.raises(LoraError, match="output.weight: this model has no output matmul of its own"):
        read_adapter(path, LlamaModel.load(tied, torch.float32).spec, "llama")


def _engine(path, adapters=(), n_parallel: int = 1, **config) -> Engine:
    bundle = ModelBundle.load(ModelConfig(path, threads=1, lora=tuple(adapters)))
    return Engine(bundle, EngineConfig(n_parallel=n_parallel, ctx_size=64 * n_parallel, **config))


def _greedy(engine: Engine, lora=None, tokens=TOKENS) -> tuple[list[int], int]:
    handle = engine.submit(Request(tuple(tokens), SamplingParams(temperature=0.0), n_predict=6, lora=lora))
    run(engine)
    out, _, final = events(handle)
    return out, final.n_cached


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """(engine with the adapter at scale 1, greedy tokens of the merged model, of the base model)."""
    tmp = tmp_path_factory.mktemp("lora")
    base, merged, adapter = _files(tmp, ARCHS["qwen2"], 1.0)
    want = _greedy(_engine(merged))[0]
    plain = _greedy(_engine(base))[0]
    assert want != plain
    return _engine(base, [(adapter, 1.0)]), want, plain


def test_requests_choose_their_adapters_and_never_reuse_another_adapters_kv(served):
    engine, want, plain = served
    assert _greedy(engine) == (want, 0)                        # the server's scale: 1
    assert _greedy(engine, ((0, 0.0),)) == (plain, 0)          # the same prompt: none of that KV serves
    assert _greedy(engine, ((0, 1.0),))[0] == want
    assert _greedy(engine, ((0, 1.0),))[1] == len(TOKENS) - 1   # the same adapters: the slot's KV serves
    with pytest.raises(RequestError, match=r"'lora\[0\].id' is 3: no such LoRA adapter"):
        engine.submit(Request(tuple(TOKENS), lora=((3, 1.0),)))


def test_adapted_decode_steps_replay_a_step_graph_with_the_eager_steps_numbers(tmp_path):
    """GGUF blocks (the fused qmatmul, step graphs): the deltas are C calls a graph replays."""
    from gguf import GGMLQuantizationType as QT
    kw = dict(ARCHS["qwen2"], tensor_type=QT.Q8_0)
    base, _, adapter = _files(tmp_path, kw, 1.0)
    out = {}
    for graphs in (True, False):
        bundle = ModelBundle.load(ModelConfig(base, weights="q", threads=1, lora=((adapter, 1.0),), step_graphs=graphs))
        engine = Engine(bundle, EngineConfig(n_parallel=2, ctx_size=128))
        handles = [engine.submit(Request(tuple(TOKENS[:n]), SamplingParams(temperature=0.0), n_predict=8, lora=lora))
                   for n, lora in ((8, None), (5, ((0, 0.5),)))]
        run(engine)
        out[graphs] = [events(h)[:2] for h in handles]
        if graphs and lora_delta.serves(1, True):   # (without C kernels, SLOTSERVER_NATIVE=0: no graphs at all)
            assert any(key[-1] == "lora" for key in bundle.model.graphs.graphs)   # an adapted step's graph was kept
    assert out[True] == out[False]


def test_the_prompt_cache_keeps_each_adapters_kv_apart():
    cache = PromptCache(-1)
    kv = (torch.zeros(2, 3), torch.zeros(2, 3))
    cache.save((1, 2, 3), *kv, ns="a")
    assert cache.best((1, 2, 3, 4)) is None and cache.best((1, 2, 3, 4), "b") is None
    assert cache.best((1, 2, 3, 4), "a")[2] == 3 and cache.has((1, 2, 3), "a") and (1, 2, 3) not in cache


def test_the_disk_cache_keeps_each_adapters_kv_apart_across_a_restart(tmp_path):
    from slotserver.engine.disk_cache import DiskCache
    kv = (torch.ones(2, 3, 1, 4), torch.ones(2, 3, 1, 4))
    store = DiskCache(tmp_path, -1, "k", torch.float32)
    store.save((1, 2, 3), *kv, ns="a")
    store.save((1, 2, 9), *kv)
    store.flush()
    for s in (store, DiskCache(tmp_path, -1, "k", torch.float32)):   # and as a restart indexes the files
        assert s.best((1, 2, 3, 4)) == ((1, 2, 9), 2) and s.best((1, 2, 3, 4), "a") == ((1, 2, 3), 3)
        assert s.best((1, 2), "b") is None and s.load((1, 2, 3)) is None and s.load((1, 2, 3), "a") is not None


def test_a_draft_model_and_embeddings_do_not_take_the_targets_adapters(tmp_path):
    """-md: the adapters are the target's (llama.cpp applies none to a draft); --embedding refuses them."""
    from slotserver.server.launch import LaunchPlan, _load_draft
    from slotserver.engine.speculative.config import SpecConfig
    from slotserver.server.config_from_args import server_config_from_args
    base, _, adapter = _files(tmp_path, ARCHS["llama"], 1.0)
    draft = write_tiny_gguf(tmp_path / "draft.gguf", d_model=32, n_heads=2, n_kv_heads=1, d_ff=64)
    plan = LaunchPlan(model=ModelConfig(base, threads=1, lora=((adapter, 1.0),)),
                      engine=EngineConfig(spec=SpecConfig(types=("draft-simple",), draft_model=draft)), warmup=False)
    assert _load_draft(plan).model.lora is None
    args = build_parser().parse_args(["serve", "-m", str(base), "--embedding", "--lora", str(adapter)])
    with pytest.raises(ConfigError, match="--lora does not run with --embedding"):
        server_config_from_args(args)


def _client(engine: Engine) -> TestClient:
    state = ServerState(ServerConfig(model_path=str(engine.bundle.config.model_path)))
    state.set_loaded(engine.bundle, engine.start(), ChatTemplate("{{ messages[0].content }}"))
    return TestClient(create_app(state))


def test_the_lora_adapters_endpoints_and_the_request_field(tmp_path):
    base, merged, adapter = _files(tmp_path, ARCHS["llama"], 0.5)
    want, plain = _greedy(_engine(merged))[0], _greedy(_engine(base))[0]
    engine = _engine(base, [(adapter, 0.5)])
    body = {"prompt": TOKENS, "n_predict": 6, "temperature": 0, "return_tokens": True}
    try:
        with _client(engine) as client:
            assert client.get("/lora-adapters").json() == [
                {"id": 0, "path": str(adapter), "scale": 0.5, "task_name": "", "prompt_prefix": ""}]
            assert client.post("/completion", json=body).json()["tokens"] == want
            assert client.post("/completion", json=body | {"lora": [{"id": 0, "scale": 0}]}).json()["tokens"] == plain
            r = client.post("/completion", json=body | {"lora": [{"id": 1, "scale": 1}]})
            assert r.status_code == 400 and "'lora[0].id' is 1: no such LoRA adapter" in r.text
            assert client.post("/lora-adapters", json=[{"id": 0, "scale": 2}, {"id": 5, "scale": 1}]).status_code == 400
            assert client.post("/lora-adapters", json={"id": 0}).status_code == 400
            assert client.post("/lora-adapters", content=b"[]", headers={"content-type": "text/plain"}).status_code == 415
            assert client.get("/lora-adapters").json()[0]["scale"] == 0.5    # refused: nothing changed
            listed = client.get("/lora-adapters").json()   # what GET lists may be POSTed back (llama-server takes it)
            assert client.post("/lora-adapters", json=[listed[0] | {"scale": 0.5}]).json() == {"success": True}
            assert client.post("/lora-adapters", json=[{"id": 0, "scale": 1, "weight": 2}]).status_code == 400
            assert client.post("/lora-adapters", json=[]).json() == {"success": True}   # unlisted: 0
            assert client.get("/lora-adapters").json()[0]["scale"] == 0.0
            assert client.post("/completion", json=body).json()["tokens"] == plain
            assert client.post("/completion", json=body | {"lora": [{"id": 0, "scale": 0.5}]}).json()["tokens"] == want
    finally:
        engine.stop()


def test_lora_flags_keep_the_command_lines_order():
    args = build_parser().parse_args(["serve", "--lora", "a.gguf", "--lora-scaled", "b.gguf:0.5,c.gguf:2",
                                      "--lora", "d.gguf,e.gguf"])
    assert [(str(p), s) for p, s in lora_flags(args.lora_items)] == [
        ("a.gguf", 1.0), ("b.gguf", 0.5), ("c.gguf", 2.0), ("d.gguf", 1.0), ("e.gguf", 1.0)]
    with pytest.raises(ConfigError, match="--lora-scaled format: FNAME:SCALE"):
        lora_flags(build_parser().parse_args(["generate", "--lora-scaled", "b.gguf"]).lora_items)
    with pytest.raises(ConfigError, match="no such file"):
        ModelConfig("x.gguf", lora=(("missing.gguf", 1.0),))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("gpu_weights", ["dense", "blocks"])
def test_on_the_gpu_an_adapter_gives_the_cpus_logits(tmp_path, gpu_weights):
    """--device cuda: the deltas on the card, rows with and without the adapter in one step, against
    the CPU's adapted model on the same Q8_0 files (not the merged file: Q8_0 rounds the merged
    weights otherwise, ~0.03 of a logit apart on this fixture). The card's own error on these
    weights (the base model, same batch, against the CPU's: ~1e-6 dense, the blocks' products on
    blocks) sets the tolerance, and must itself be small beside what the adapter changes."""
    from gguf import GGMLQuantizationType as QT
    kw = dict(ARCHS["qwen2"], tensor_type=QT.Q8_0)
    base, _, adapter = _files(tmp_path, kw, 1.0)
    chunks = [_prompt(0, (1.0,)), _prompt(1, (), TOKENS[:5])]
    bare = [_prompt(0), _prompt(1, (), TOKENS[:5])]
    assert _gpu_lora_check(base, adapter, chunks, bare, gpu_weights) == []


def _gpu_lora_check(base, adapter, chunks, bare, gpu_weights: str, device: str = "cuda", load=None) -> list[str]:
    """What test_on_the_gpu_an_adapter_gives_the_cpus_logits checks, as a list of failures (`load`:
    the device model's loader; the default loads --device `device` through ModelBundle)."""
    def device_model(lora=()):
        if load is not None:
            return load(base, lora)
        return ModelBundle.load(ModelConfig(base, dtype="float32", device=device, gpu_weights=gpu_weights,
                                            lora=lora)).model
    n, bad = len(TOKENS), []
    got = _logits(device_model(((adapter, 1.0),)), chunks)
    want = _logits(_with_adapter(base, adapter), chunks)                       # the CPU's, same files
    base_dev, base_cpu = _logits(device_model(), bare), _logits(LlamaModel.load(base, torch.float32), bare)
    device_err = float((base_dev - base_cpu).abs().mean())
    effect = float((want[:n] - base_cpu[:n]).abs().mean())                     # what the adapter changes
    if not (want[:n] - base_cpu[:n]).abs().max() > 0.5:
        bad.append("the adapter does not change the answer")
    if not device_err < 0.05 * effect:
        bad.append(f"the device's own error {device_err:.3g} is too large beside the adapter's effect {effect:.3g}")
    err = float((got - want).abs().mean())
    if not err < 2 * device_err + 1e-4:
        bad.append(f"adapted batch {err:.3g} from the CPU's (the device's own error {device_err:.3g})")
    rest = float((got[n:] - base_dev[n:]).abs().max())
    if not rest < 1e-3:
        bad.append(f"rows without the adapter {rest:.3g} from the base model's on the device")
    return bad


@pytest.mark.parametrize("wrong", [0.0, 0.1])
def test_the_card_lora_check_fails_a_wrong_delta(tmp_path, wrong):
    """`_gpu_lora_check` (the card test's check) with a CPU model standing in for the device's:
    the same deltas pass; deltas 10% too large fail it."""
    from gguf import GGMLQuantizationType as QT
    kw = dict(ARCHS["qwen2"], tensor_type=QT.Q8_0)
    base, _, adapter = _files(tmp_path, kw, 1.0)

    def load(path, lora=()):
        model = LlamaModel.load(path, torch.float32)
        if lora:
            model.lora = LoraSet([read_adapter(lora[0][0], model.spec, model.spec.arch)], model.spec)
            for packed in model.lora._packed.values():
                packed.factor.mul_(1 + wrong)
        return model
    chunks = [_prompt(0, (1.0,)), _prompt(1, (), TOKENS[:5])]
    bad = _gpu_lora_check(base, adapter, chunks, [_prompt(0), _prompt(1, (), TOKENS[:5])], "dense", load=load)
    assert (bad == []) == (wrong == 0.0), bad
