"""`--device`: how it resolves, what a CPU-only machine says to `cuda`, the weights' move to a
device (every field of every weight type, so a forward after the move gives the same logits), the
lab's thread sandbox (CUDA cannot fork), and on a CUDA machine the same greedy tokens as the CPU."""

from __future__ import annotations

import time

import pytest
import torch

from slotserver.errors import ConfigError
from slotserver.lab.sandbox import run_isolated, run_threaded
from slotserver.model.config import ModelConfig
from slotserver.model.generate import GenRequest, generate
from slotserver.model.model import LlamaModel
from slotserver.model.placement import to_device
from slotserver.runtime.device import kernel_impl, resolve_device
from tiny_gguf import write_tiny_gguf

CUDA = torch.cuda.is_available()


def test_auto_takes_the_gpu_only_when_torch_sees_one():
    assert resolve_device("auto") == ("cuda" if CUDA else "cpu")
    assert resolve_device("cpu") == "cpu" and kernel_impl("cpu") == "cpu" and kernel_impl("cuda") == "triton"
    with pytest.raises(ConfigError, match="--device must be one of auto, cpu, cuda"):
        resolve_device("tpu")


@pytest.mark.skipif(CUDA, reason="this machine has a GPU")
def test_cuda_without_a_gpu_is_an_error_at_startup(tmp_path):
    path = write_tiny_gguf(tmp_path / "m.gguf")
    with pytest.raises(ConfigError, match="--device cuda: torch sees no CUDA device"):
        ModelConfig(path, device="cuda")
    assert ModelConfig(path, device="auto").resolved_device == "cpu"


@pytest.mark.parametrize("weights,tensor_type", [("auto", "F32"), ("q", "Q8_0"), ("int8", "F32")])
def test_moved_weights_compute_the_same_logits(tmp_path, weights, tensor_type):
    """to_device rebuilds every weight dataclass (Linear re-runs its prepack, QWeight keeps its
    bytes): a model whose weights went through it answers with the same floats."""
    import gguf
    from slotserver.model.weights import WeightFormat

    path = write_tiny_gguf(tmp_path / "m.gguf", tensor_type=gguf.GGMLQuantizationType[tensor_type])
    dtype = torch.float32 if weights != "int8" else torch.bfloat16
    model = LlamaModel.load(path, dtype, fmt=WeightFormat(weights))
    moved = LlamaModel(model.spec, to_device(model.weights, "cpu"), model.kernels, model.rope, model.dtype,
                       model.path, model.layer_ropes)
    assert type(moved.weights.layers[0].qkv) is type(model.weights.layers[0].qkv)
    reqs = [GenRequest([5, 17, 200, 33], 6, ignore_eos=True)]
    assert [r.tokens for r in generate(moved, reqs, frozenset())] == [r.tokens for r in generate(model, reqs, frozenset())]


def test_the_thread_sandbox_reports_results_errors_and_time_limits():
    assert run_threaded(lambda: {"ok": True, "max_err": 0.5}, 5) == {"ok": True, "max_err": 0.5}
    bad = run_threaded(lambda: 1 / 0, 5)
    assert not bad["ok"] and "ZeroDivisionError" in bad["reason"]
    slow = run_threaded(lambda: time.sleep(3) or {"ok": True}, 0.2)
    assert not slow["ok"] and "time limit" in slow["reason"]
    assert run_isolated(lambda: {"ok": True}, 5, "cpu") == {"ok": True}   # the fork, on the CPU


@pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
def test_cuda_greedy_tokens_match_the_cpu(tmp_path):
    """The same tiny model, float32, on the GPU (Triton kernels, cuBLAS) and on the CPU."""
    from slotserver.model.bundle import ModelBundle

    path = write_tiny_gguf(tmp_path / "m.gguf")
    reqs = [GenRequest([5, 17, 200, 33, 1, 90], 8, ignore_eos=True), GenRequest([7, 8, 9], 8, ignore_eos=True)]
    out = {}
    for dev in ("cpu", "cuda"):
        bundle = ModelBundle.load(ModelConfig(path, device=dev))
        assert bundle.model.device == dev and bundle.model.kernels.impl == kernel_impl(dev)
        out[dev] = [r.tokens for r in generate(bundle.model, reqs, frozenset())]
    assert out["cuda"] == out["cpu"]


@pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
@pytest.mark.parametrize("tensor_type", ["Q8_0", "Q4_K", "Q4_0"])
def test_cuda_blocks_weights_give_the_dense_weights_tokens(tmp_path, tensor_type):
    """`--gpu-weights blocks` (kernels/qmatmul_gpu.py on the file's blocks) against `dense`
    (cuBLAS on the dequantized weights), float32: the same greedy tokens; in bf16 the blocks' CUDA
    graph replays give their eager steps' tokens."""
    import gguf
    from slotserver.model.bundle import ModelBundle

    path = write_tiny_gguf(tmp_path / "m.gguf", tensor_type=gguf.GGMLQuantizationType[tensor_type],
                           d_model=256, d_ff=512, n_heads=4, n_kv_heads=2)
    reqs = [GenRequest([5, 17, 200, 33, 1, 90], 8, ignore_eos=True), GenRequest([7, 8, 9], 8, ignore_eos=True)]
    out = {}
    for form, dtype in (("dense", "float32"), ("blocks", "float32"), ("blocks", "auto")):
        bundle = ModelBundle.load(ModelConfig(path, device="cuda", dtype=dtype, gpu_weights=form))
        assert bundle.config.weight_format.kind == form
        assert {getattr(m, "op", "dense") for m in bundle.model.weights.matmuls()} == \
            ({"qmatmul_gpu"} if form == "blocks" else {"dense"})
        out[form, dtype] = [r.tokens for r in generate(bundle.model, reqs, frozenset())]
        if dtype == "auto":
            bundle.model.set_step_graphs(False)
            assert [r.tokens for r in generate(bundle.model, reqs, frozenset())] == out[form, dtype]
    assert out["blocks", "float32"] == out["dense", "float32"]


def test_greedy_on_the_device_picks_the_hosts_tokens():
    """The device greedy path (argmax where the logits are, only ids back) gives the host sampler's
    tokens, biases and ties included, refuses rows it does not serve, and names a NaN row.
    It is device-agnostic torch, so the CPU runs the same code a GPU does."""
    from slotserver.model.sampling.greedy import greedy_tokens_device
    from slotserver.model.sampling.params import SamplingError, SamplingParams
    from slotserver.model.sampling.sampler import Sampler, SequenceRng

    gen = torch.Generator().manual_seed(7)
    logits = torch.randn(5, 300, generator=gen)
    logits[3, 10] = logits[3, 200] = logits[3].max() + 1          # a tie: the first index wins
    params = [SamplingParams(temperature=0.0) for _ in range(5)]
    params[1] = SamplingParams(temperature=0.0, logit_bias=((int(logits[1].argmax()), float("-inf")),))
    params[2] = SamplingParams(temperature=0.0, logit_bias=((5, 100.0), (5, -50.0)))   # added in turn
    got = greedy_tokens_device(logits, params)
    host = Sampler(300).sample(logits, params, [SequenceRng(1) for _ in params], [[] for _ in params])
    assert got.tolist() == host.tokens.tolist()   # the host sampler (its C greedy pass where it is built)
    assert got[3] == 10 and got[2] == 5 and got[1] != logits[1].argmax()
    assert greedy_tokens_device(logits, [SamplingParams(temperature=0.8)] * 5) is None
    assert greedy_tokens_device(logits, [SamplingParams(temperature=0.0, n_probs=2)] * 5) is None
    logits[4, 0] = float("nan")
    with pytest.raises(SamplingError, match="row 4"):
        greedy_tokens_device(logits, params)


def test_a_replayed_decode_reads_its_batch_through_one_copy():
    """CUDA-graph inputs: the context buckets that fix the attention's grid, and the copy of a new
    decode batch into the captured one (every field, through the one tensor they are views of)."""
    from slotserver.model.cuda_graph import _copy_inputs, kv_bucket
    from slotserver.runtime.batch import Batch, SeqChunk

    assert [kv_bucket(n) for n in (1, 256, 257, 512, 513, 4096, 4097)] == [256, 256, 512, 512, 1024, 4096, 8192]
    old = Batch.build([SeqChunk(0, 10, [5]), SeqChunk(1, 20, [6])])
    new = Batch.build([SeqChunk(3, 700, [8]), SeqChunk(2, 300, [9])])
    _copy_inputs(old, new)
    assert all(torch.equal(a, b) for a, b in zip(old.tensors(), new.tensors()))


@pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
def test_cuda_graph_replays_give_the_eager_tokens(tmp_path):
    """Decode steps replayed from CUDA graphs, across a context bucket (256 -> 512 cells) and at
    two batch sizes, give the eager steps' greedy tokens; a kernel swap drops the graphs."""
    from slotserver.model.bundle import ModelBundle

    path = write_tiny_gguf(tmp_path / "m.gguf", ctx_len=1024)
    bundle = ModelBundle.load(ModelConfig(path, device="cuda", dtype="float32"))
    model = bundle.model
    reqs = [GenRequest(list(range(5, 250)), 30, ignore_eos=True), GenRequest([7, 8, 9], 30, ignore_eos=True)]
    model.set_step_graphs(False)
    eager = [r.tokens for r in generate(model, reqs, frozenset())]
    model.set_step_graphs(True)
    assert [r.tokens for r in generate(model, reqs, frozenset())] == eager
    assert model.graphs.captures >= 2 and model.graphs.replays > 20
    model.kernels = model.kernels.with_module("rms_norm", model.kernels.modules["rms_norm"])
    assert [r.tokens for r in generate(model, reqs[1:], frozenset())] == eager[1:]


@pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
@pytest.mark.parametrize("layout", ["paged", "paged_hnd"])
def test_cuda_graph_replays_of_paged_layouts_give_the_eager_tokens(tmp_path, layout):
    """Paged layouts replay too (runtime/paged_blocks.py graph_step): decode steps crossing block
    boundaries and a context bucket, the pool growing on the way, give the eager steps' tokens."""
    from slotserver.model.bundle import ModelBundle

    path = write_tiny_gguf(tmp_path / "m.gguf", ctx_len=1024)
    model = ModelBundle.load(ModelConfig(path, device="cuda", dtype="float32")).model
    reqs = [GenRequest(list(range(5, 250)), 30, ignore_eos=True), GenRequest([7, 8, 9], 30, ignore_eos=True)]
    model.set_step_graphs(False)
    eager = [r.tokens for r in generate(model, reqs, frozenset(), layout=layout)]
    model.set_step_graphs(True)
    assert [r.tokens for r in generate(model, reqs, frozenset(), layout=layout)] == eager
    assert model.graphs.captures >= 2 and model.graphs.replays > 20


@pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
def test_the_engine_on_cuda_serves_like_the_cpu(tmp_path):
    """The engine on the GPU (graphs, greedy on the device, host samplers on copied rows): greedy
    requests give the CPU engine's tokens; seeded sampling and n_probs answer on both."""
    from slotserver.engine.config import EngineConfig
    from slotserver.engine.engine import Engine
    from slotserver.engine.request import Request
    from slotserver.model.bundle import ModelBundle
    from slotserver.model.sampling.params import SamplingParams

    path = write_tiny_gguf(tmp_path / "m.gguf")
    out = {}
    for dev in ("cpu", "cuda"):
        engine = Engine(ModelBundle.load(ModelConfig(path, device=dev)), EngineConfig(n_parallel=4, ctx_size=512)).start()
        try:
            hs = [engine.submit(Request(prompt_ids=tuple(range(5 + i, 40 + 3 * i)), n_predict=12, ignore_eos=True,
                                        params=SamplingParams(temperature=0.0))) for i in range(3)]
            hs.append(engine.submit(Request(prompt_ids=(5, 6, 7), n_predict=8, ignore_eos=True,
                                            params=SamplingParams(temperature=0.9, seed=3, n_probs=2))))
            res = [h.result(timeout=120) for h in hs]
        finally:
            engine.stop()
        out[dev] = [r.tokens for r in res[:3]]
        assert len(res[3].tokens) == 8
    assert out["cuda"] == out["cpu"]


def test_a_bf16_weight_blocked_for_onednn_moves_as_its_plain_matrix():
    """A bf16 load on an AVX-512 host re-blocks dense weights for oneDNN (CPU-only); a move to
    another device takes the plain [out, in] matrix back (the first H100 run failed here)."""
    from slotserver.model.linear import Linear

    w = torch.randn(32, 64).bfloat16()
    moved = to_device(Linear(w.clone(), torch.ones(32).bfloat16()), "meta")
    assert moved.packed is None and moved.dense.device.type == "meta" and moved.dense.shape == (32, 64)
    assert moved.bias.device.type == "meta"


def test_a_position_past_the_rope_table_is_refused_before_any_kernel(tmp_path):
    """The forward checks the batch's positions on the host (from its max_kv), for every device:
    the rope lookup no longer reads them back each step."""
    from slotserver.engine.kv_cache import KVCache
    from slotserver.runtime.batch import Batch, SeqChunk
    from slotserver.runtime.kv_spec import KVSpec

    model = LlamaModel.load(write_tiny_gguf(tmp_path / "m.gguf", ctx_len=64), torch.float32)
    s = model.spec
    cache = KVCache.create("head_seq_dim", KVSpec(s.n_layers, 1, 128, s.n_kv_heads, s.head_dim, torch.float32))
    with pytest.raises(ValueError, match="position 64 beyond the rope table"):
        model.forward(Batch.build([SeqChunk(0, 60, [5, 6, 7, 8, 9])]), cache)
    assert model.forward(Batch.build([SeqChunk(0, 59, [5, 6, 7, 8, 9])]), cache).shape[0] == 1
