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
