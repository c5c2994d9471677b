"""`--gpu-weights` (model/gpu_weights.py) on CPU tensors: every GGUF type the CPU loader accepts has
an answer on the CUDA load path (a qmatmul_gpu kernel, or a dequantization to bf16 equal to gguf's),
MoE experts included; the auto policy by memory; the config's validation and /props' field."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch

from slotserver.errors import ConfigError
from slotserver.model import gpu_weights
from slotserver.model.config import ModelConfig
from slotserver.model.linear import Linear, QLinear
from slotserver.model.moe import MoeWeights
from slotserver.model.block_layer import SERVED as _SERVED
from slotserver.runtime.experts import Experts
from slotserver.runtime.kernel_set import KERNEL_CONTRACT
from slotserver.runtime.loader import default_dir, load_by_path
from slotserver.runtime.qblocks import FLOATS, QUANTIZED, T, QWeight, dequantize, random_qweight
from tiny_gguf import write_tiny_gguf

FORMATS = frozenset(int(t) for t in load_by_path(default_dir("kernels") / "qmatmul_gpu.py", KERNEL_CONTRACT).module.FORMATS)


def _dequantizable(qtype: T) -> bool:
    """gguf can dequantize it: the CPU loader then serves it dense (block_layer.qlinear)."""
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    try:
        gguf.quants.dequantize(np.zeros((1, size), dtype=np.uint8), qtype)
        return True
    except (NotImplementedError, KeyError, ValueError):
        return False


CPU_TYPES = [t for t in T if t in gguf.GGML_QUANT_SIZES and (int(t) in _SERVED or _dequantizable(t))]


def _as_cpu_loads(qtype: T, gen: torch.Generator):
    """The matmul the CPU loader builds for a [32, 256] tensor of `qtype` (block_layer.qlinear), and
    the float32 values it holds."""
    if int(qtype) in _SERVED:
        w = random_qweight(gen, qtype, 32, 256)
        return QLinear([w]), w.float_view().float() if qtype in FLOATS else dequantize(w)
    block, size = gguf.GGML_QUANT_SIZES[qtype]   # the IQ types: random bytes, dequantized dense at load
    raw = torch.randint(0, 256, (32, 256 // block * size), generator=gen, dtype=torch.uint8)
    raw.view(-1, size)[:, :2] = torch.tensor([0x00, 0x30], dtype=torch.uint8)   # d = 0.125 where a float16 d leads
    values = dequantize(QWeight(raw, int(qtype), 256, 32))
    return Linear.build(values, None, "dense", 0), values


@pytest.mark.parametrize("qtype", CPU_TYPES, ids=lambda t: t.name)
def test_every_type_the_cpu_loads_has_a_cuda_answer(qtype):
    lin, values = _as_cpu_loads(qtype, torch.Generator().manual_seed(int(qtype)))
    out = gpu_weights.matmul(lin, torch.bfloat16, FORMATS)
    if int(qtype) in FORMATS:   # the blocks stay, multiplied by the kernel (its numerics: test_qmatmul_gpu.py)
        assert isinstance(out, QLinear) and out.op == gpu_weights.GPU_OP and out.parts[0] is lin.parts[0]
    else:                       # dequantized at load to the compute dtype, for cuBLAS (the CPU may block it for oneDNN)
        assert isinstance(out, Linear)
        dense = out.dense if out.dense is not None else out.packed.to_dense()
        assert dense.dtype == torch.bfloat16 and dense.shape == (32, 256)
        assert torch.allclose(dense.float(), values.to(torch.bfloat16).float(), equal_nan=True)


def test_the_formats_real_files_use_all_have_kernels():
    assert {int(t) for t in (T.Q8_0, T.Q4_K, T.Q6_K, T.Q5_0, T.Q4_0, T.Q4_1, T.Q5_K, T.MXFP4)} <= FORMATS
    assert set(QUANTIZED) - {T(t) for t in FORMATS} == {T.Q2_K, T.Q3_K}


@pytest.mark.parametrize("qtype", [T.MXFP4, T.Q4_K, T.Q8_0])
def test_moe_experts_are_dequantized_for_the_card(qtype):
    gen = torch.Generator().manual_seed(3)
    parts = (random_qweight(gen, qtype, 4 * 16, 256), random_qweight(gen, qtype, 4 * 16, 256))
    moe = MoeWeights(torch.zeros(4, 256, dtype=torch.float64), [Experts(parts, 4)], Experts((parts[0],), 4))
    out = gpu_weights._dense_moe(moe, torch.bfloat16)
    e = out.gate_up[0]
    assert e.qtype == int(T.BF16) and e.n == 32 and e.n_expert == 4
    assert torch.equal(e.dense(2), Experts(parts, 4).dense(2).to(torch.bfloat16).float())


def test_auto_takes_dense_while_it_fits_and_blocks_beyond():
    gb = 1 << 30
    assert gpu_weights.choose("auto", 1 * gb, 79 * gb) == "dense"     # a 0.5B on an H100
    assert gpu_weights.choose("auto", 16 * gb, 79 * gb) == "dense"    # an 8B: 16 GB of bf16
    assert gpu_weights.choose("auto", 140 * gb, 79 * gb) == "blocks"  # a 70B: would not fit
    assert gpu_weights.choose("blocks", 1 * gb, 79 * gb) == "blocks"
    assert gpu_weights.choose("dense", 140 * gb, 79 * gb) == "dense"


def test_dense_bytes_counts_every_matrix_at_two_bytes(tmp_path):
    from slotserver.model.gguf_file import GGUFFile

    f = GGUFFile.open(write_tiny_gguf(tmp_path / "m.gguf", tensor_type=T.Q4_K, d_model=256, d_ff=512))
    mats = [i for i in f.tensors.values() if len(i.shape) == 2]
    assert gpu_weights.dense_bytes(f) == sum(2 * i.shape[0] * i.shape[1] for i in mats) > 1e6


def test_gpu_weights_is_validated_and_off_cuda_changes_nothing(tmp_path):
    path = write_tiny_gguf(tmp_path / "m.gguf", tensor_type=T.Q8_0)   # no default model on a GPU machine
    with pytest.raises(ConfigError, match="--gpu-weights must be one of auto, dense, blocks, got 'q4'"):
        ModelConfig(model_path=path, gpu_weights="q4")
    cfg = ModelConfig(model_path=path, device="cpu", gpu_weights="blocks", dtype="auto")
    assert cfg.weight_format.kind == "q"   # the CPU serves its own blocks


def test_a_tied_embedding_moves_once():
    """to_device gives the embedding and the output projection that share blocks one copy."""
    from slotserver.model.placement import to_device
    from slotserver.model.weights import Embedding

    w = random_qweight(torch.Generator().manual_seed(4), T.Q8_0, 8, 64)
    embed, out = to_device([Embedding(blocks=w), QLinear([w], op=gpu_weights.GPU_OP)], "cpu")
    assert embed.blocks is out.parts[0] and out.op == gpu_weights.GPU_OP
    assert torch.equal(embed.blocks.raw, w.raw)
