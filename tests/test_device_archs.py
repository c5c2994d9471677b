"""On a CUDA machine, every architecture fixture and every GGUF block format the CPU loads also
loads and answers on the GPU, with the CPU's greedy tokens (float32: dense weights, dequantized on
the card by runtime/torch_dequant.py where ported, by gguf-py elsewhere). Skipped without CUDA;
playground/gpu_check.sh runs it on the lent GPU."""

from __future__ import annotations

from pathlib import Path

import gguf
import pytest
import torch

from slotserver.model.bundle import ModelBundle
from slotserver.model.config import ModelConfig
from slotserver.model.generate import GenRequest, generate
from tiny_gguf import write_tiny_gguf

CUDA = torch.cuda.is_available()
ARCHS = sorted((Path(__file__).parent / "fixtures" / "archs").glob("*.gguf"))
QT = gguf.GGMLQuantizationType
FORMATS = [QT.Q4_0, QT.Q4_1, QT.Q5_0, QT.Q5_1, QT.Q8_0, QT.Q4_K, QT.Q6_K, QT.MXFP4, QT.F16, QT.BF16]   # gguf-py encodes these
pytestmark = pytest.mark.skipif(not CUDA, reason="needs a CUDA device")


def _tokens(path: Path) -> dict[str, list[list[int]]]:
    reqs = [GenRequest([5, 17, 200, 33, 1, 90], 8, ignore_eos=True), GenRequest([7, 8, 9], 6, ignore_eos=True)]
    out = {}
    for dev in ("cpu", "cuda"):
        bundle = ModelBundle.load(ModelConfig(path, dtype="float32", device=dev))
        assert bundle.model.device == dev
        out[dev] = [r.tokens for r in generate(bundle.model, reqs, frozenset())]
    return out


@pytest.mark.parametrize("path", ARCHS, ids=lambda p: p.stem)
def test_every_architecture_answers_on_the_gpu_as_on_the_cpu(path):
    out = _tokens(path)
    assert out["cuda"] == out["cpu"]


@pytest.mark.parametrize("qtype", FORMATS, ids=lambda t: t.name)
def test_every_block_format_loads_on_the_gpu(tmp_path, qtype):
    path = write_tiny_gguf(tmp_path / "m.gguf", tensor_type=qtype, d_model=256, d_ff=512, n_heads=4, n_kv_heads=2)
    out = _tokens(path)
    assert out["cuda"] == out["cpu"]


@pytest.mark.parametrize("name", ["qwen35", "lfm2", "granitehybrid_dense", "nemotron_h", "falcon_h1"])
def test_a_hybrids_decode_steps_replay_from_cuda_graphs_with_the_eager_tokens(name):
    """A hybrid model's decode steps on the card are CUDA graphs (step_replay.new_graphs): the
    capture runs nothing, the replays update the recurrent states in place through the streams'
    device tensors. Three requests of different lengths (rows join and leave): the replayed steps
    give the tokens of the same model with graphs off."""
    bundle = ModelBundle.load(ModelConfig(ARCHS[0].with_name(f"{name}.gguf"), dtype="float32", device="cuda"))
    reqs = [GenRequest([5 + i, 17, 200, 33, 1, 90][: 6 - i], 10 - 2 * i, ignore_eos=True) for i in range(3)]
    replayed = [r.tokens for r in generate(bundle.model, reqs, frozenset())]
    assert bundle.model.graphs.replays > 0, "no decode step was replayed"
    bundle.model.set_step_graphs(False)
    assert [r.tokens for r in generate(bundle.model, reqs, frozenset())] == replayed
