"""Tiny random GGUF models in many tensor types and architectures load and compute the right thing,
and broken model files end in one clear line naming the file and the problem."""

from __future__ import annotations

import gguf
import pytest
import torch
from llama_reference import llama_logits
from tiny_gguf import write_tiny_gguf

from slotserver.runtime.batch import Batch, SeqChunk
from slotserver.model.bundle import ModelBundle
from slotserver.cli.main import main
from slotserver.model.config import ModelConfig
from slotserver.model.generate import GenRequest, generate
from slotserver.model.gguf_file import GGUFError
from slotserver.runtime.kv_spec import KVSpec
from slotserver.runtime.layouts import create_layout, load_layout

QT = gguf.GGMLQuantizationType
TYPES = [QT.F32, QT.F16, QT.BF16, QT.Q8_0, QT.Q4_0, QT.Q4_1, QT.Q5_0, QT.Q5_1, QT.Q4_K, QT.Q6_K]
TOKENS = [40, 72, 220, 300, 5, 17, 99, 250, 301, 7, 8]


def _bundle(path, dtype="float32") -> ModelBundle:
    return ModelBundle.load(ModelConfig(model_path=path, dtype=dtype))


def _logits(model, tokens) -> torch.Tensor:
    s = model.spec
    cache = create_layout(load_layout("seq_head_dim"), KVSpec(s.n_layers, 1, 64, s.n_kv_heads, s.head_dim, model.dtype))
    return model.forward(Batch.build([SeqChunk(0, 0, tokens, all_logits=True)]), cache)


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_every_tensor_type_loads_and_matches_an_independent_forward(tmp_path, qtype):
    k_quant = qtype in (QT.Q4_K, QT.Q6_K)
    path = write_tiny_gguf(tmp_path / f"{qtype.name}.gguf", tensor_type=qtype,
                           d_model=256 if k_quant else 64, d_ff=512 if k_quant else 128)
    model = _bundle(path).model
    want = llama_logits(path, TOKENS)
    torch.testing.assert_close(_logits(model, TOKENS).double(), want, atol=2e-4, rtol=1e-4)


@pytest.mark.parametrize("variant", [
    dict(arch="qwen2", qkv_bias=True),          # neox rope + q/k/v biases
    dict(arch="llama", tied_embeddings=False),  # separate output.weight
    dict(arch="llama", n_heads=4, n_kv_heads=1),  # multi-query
    dict(arch="mistral", n_heads=8, n_kv_heads=8, d_model=128),
], ids=["qwen2", "untied", "mqa", "mistral-mha"])
def test_architectures_match_an_independent_forward(tmp_path, variant):
    path = write_tiny_gguf(tmp_path / "m.gguf", **variant)
    model = _bundle(path).model
    torch.testing.assert_close(_logits(model, TOKENS).double(), llama_logits(path, TOKENS), atol=2e-4, rtol=1e-4)


def test_tiny_model_generates_and_chats(tmp_path):
    b = _bundle(write_tiny_gguf(tmp_path / "m.gguf"))
    text = b.template.render([{"role": "user", "content": "Hello world"}])
    ids = b.tokenizer.encode(text, parse_special=True)
    assert ids[0] == b.tokenizer.token_to_id("<|im_start|>")
    out = generate(b.model, [GenRequest(ids, 5, ignore_eos=True)], b.tokenizer.eog_ids)[0]
    assert len(out.tokens) == 5 and all(0 <= t < b.model.spec.vocab_size for t in out.tokens)


def test_bfloat16_tiny_model_stays_close_to_float32(tmp_path):
    path = write_tiny_gguf(tmp_path / "m.gguf")
    a, b = _logits(_bundle(path).model, TOKENS), _logits(_bundle(path, "bfloat16").model, TOKENS)
    assert (a - b).abs().max() < 0.1 * a.abs().max()


def _truncate(p):
    data = p.read_bytes()
    p.write_bytes(data[: len(data) // 2])


BROKEN = {
    "unknown architecture": (dict(**{"general.architecture": "gpt5"}), None,
                             "unknown architecture 'gpt5' (supported: llama, mistral, qwen2, qwen3, gemma2, gemma3"),
    "unsupported rope": (dict(**{"llama.rope.scaling.type": "su"}), None, "rope scaling type 'su' is not supported"),
    "missing tensor": (dict(n_layers=2, **{"llama.block_count": 3}), None, "missing tensor blk.2."),
    "wrong shape": (dict(**{"llama.feed_forward_length": 96}), None, "has shape"),
    "absurd dimension": (dict(**{"llama.embedding_length": 2**31}), None, "not a sane positive integer"),
    "truncated": ({}, _truncate, "outside the file"),
    "bad magic": ({}, lambda p: p.write_bytes(b"GGML" + p.read_bytes()[4:]), "not a GGUF file"),
}


@pytest.mark.parametrize("case", BROKEN, ids=str)
def test_broken_model_file_gives_one_clear_line(tmp_path, capsys, case):
    kwargs, damage, phrase = BROKEN[case]
    path = write_tiny_gguf(tmp_path / "broken.gguf", **kwargs)
    if damage:
        damage(path)
    with pytest.raises(GGUFError) as err:
        _bundle(path)
    assert phrase in str(err.value) and "broken.gguf" in str(err.value) and "\n" not in str(err.value)
    assert main(["generate", "-m", str(path), "hi"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and phrase in lines[0] and "broken.gguf" in lines[0]


@pytest.mark.parametrize("weights", ["int8", "int4", "auto4"])
def test_weight_only_formats_stay_close_to_dense(tmp_path, weights):
    """Decode-sized batches go through the int8/int4 matmuls; int4 re-encodes Q4_1 exactly."""
    path = write_tiny_gguf(tmp_path / "q41.gguf", tensor_type=QT.Q4_1)
    dense = _bundle(path).model
    quant = ModelBundle.load(ModelConfig(model_path=path, weights=weights)).model
    if weights != "int8":
        assert quant.weights.layers[0].qkv.q4 is not None
    a, b = _logits(dense, TOKENS[:4]), _logits(quant, TOKENS[:4])
    assert (a - b).abs().max() < 0.02 * a.abs().max()
