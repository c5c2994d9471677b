"""A file whose tensors the model does not all read is refused by name, as llama.cpp refuses a file
with tensors its architecture does not create: served, it would compute another model."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from tiny_gguf import write_tiny_gguf

from slotserver.errors import GGUFError
from slotserver.model.model import LlamaModel
from slotserver.model.tensor_table import TensorTable
from slotserver.model.weights import WeightFormat


def test_reads_are_indexes_and_gets_not_membership_or_values():
    table = TensorTable(a=1, b=2, c=3)
    assert "a" in table and list(table.values()) == [1, 2, 3] and table.unread() == ["a", "b", "c"]
    assert table["b"] == 2 and table.get("c") == 3 and table.get("zz") is None
    assert table.unread() == ["a"]


def _with_biases(weights: dict) -> dict:
    d = weights["blk.0.attn_output.weight"].shape[0]
    return weights | {"blk.0.attn_output.bias": np.ones(d, np.float32), "blk.1.ffn_down.bias": np.ones(d, np.float32)}


@pytest.mark.parametrize("fmt", ["auto", "dense", "q", "int8"])
def test_a_llama_file_with_biases_it_would_not_add_is_refused_naming_them(tmp_path, fmt):
    plain = write_tiny_gguf(tmp_path / "plain.gguf")
    LlamaModel.load(plain, torch.float32, fmt=WeightFormat(fmt))   # every tensor read: loads
    path = write_tiny_gguf(tmp_path / "biased.gguf", transform=_with_biases)
    with pytest.raises(GGUFError, match=r"biased.gguf: 2 tensors that this server's llama model does not use "
                                        r"\(blk\.0\.attn_output\.bias, blk\.1\.ffn_down\.bias\)"):
        LlamaModel.load(path, torch.float32, fmt=WeightFormat(fmt))
