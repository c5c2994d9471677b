"""The GPU load path's dequantizers (runtime/torch_dequant.py) give gguf-py's floats bit for bit,
for every ported format, so a model dequantized on the device computes what the CPU reference does."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as T

from slotserver.runtime import torch_dequant
from slotserver.runtime.qblocks import random_qweight

PORTED = [T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.Q4_K, T.Q5_K, T.Q6_K, T.MXFP4]


@pytest.mark.parametrize("qtype", PORTED, ids=lambda t: t.name)
def test_equal_to_gguf_bit_for_bit(qtype):
    gen = torch.Generator().manual_seed(int(qtype))
    w = random_qweight(gen, qtype, 37, 512)
    if qtype != T.MXFP4:   # random bytes everywhere, scales included (finite f16 only: NaN != NaN)
        raw = torch.randint(0, 256, w.raw.shape, generator=gen, dtype=torch.uint8)
        with np.errstate(all="ignore"):
            ref = gguf.quants.dequantize(raw.numpy(), qtype)
        finite = np.isfinite(ref).all(axis=1)
        raw, ref = raw[torch.from_numpy(finite)], ref[finite]
    else:
        raw = w.raw
        ref = gguf.quants.dequantize(raw.numpy(), qtype)
    assert raw.shape[0] > 0
    got = torch_dequant.dequantize(raw, qtype, 512)
    assert got.dtype == torch.float32 and got.shape == (raw.shape[0], 512)
    assert np.array_equal(got.numpy().view(np.uint32), np.asarray(ref, dtype=np.float32).view(np.uint32))


def test_a_format_not_ported_says_so():
    assert not torch_dequant.ported(T.IQ4_NL) and torch_dequant.dequantize(torch.zeros(1, 18, dtype=torch.uint8),
                                                                            T.IQ4_NL, 32) is None


def test_weights_dequantized_by_torch_load_as_with_numpy(tmp_path):
    """The loader's torch path (GGUFFile.dequant_device, the default) against gguf-py's numpy
    (dequant_device None): every matmul weight of a Q4_K/Q6_K file equal."""
    from slotserver.model.gguf_file import GGUFFile
    from slotserver.model.spec import ModelSpec
    from slotserver.model.read_weights import load_weights
    from slotserver.model.weights import WeightFormat
    from tiny_gguf import write_tiny_gguf

    path = write_tiny_gguf(tmp_path / "m.gguf", tensor_type=T.Q4_K, d_model=256, d_ff=512)
    f = GGUFFile.open(path)
    spec = ModelSpec.from_gguf(f)
    f.dequant_device = None
    numpy_w = load_weights(f, spec, torch.float32, fmt=WeightFormat("dense"))
    f.dequant_device = "cpu"
    torch_w = load_weights(f, spec, torch.float32, fmt=WeightFormat("dense"))
    for a, b in zip(numpy_w.matmuls(), torch_w.matmuls()):
        assert torch.equal(a.dense, b.dense)
    assert torch.equal(numpy_w.embed.dense, torch_w.embed.dense)
