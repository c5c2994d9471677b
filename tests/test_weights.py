"""GGUF-block weights (`--weights auto` / `q`): mapped from the file, computed on by qmatmul.

- tiny models of every format the kernel serves give the float32 reference's logits within the
  8-bit-activation error, in both dtypes, for llama and qwen2 (neox rope + q/k/v biases);
- the matmul weights are views of the file's mapping (nothing copied at load); q|k|v too where
  stored back to back (llama.cpp-written files do not: there it is copied once into one tensor);
- the embedding lookup dequantizes exactly the rows asked for;
- `ModelConfig` defaults: `--dtype auto` is bf16 only where the CPU computes it natively, and
  `--weights auto` is the quantized kernels except under an explicit `--dtype float32`.
"""

from __future__ import annotations

import gguf
import pytest
import torch
from tiny_gguf import write_tiny_gguf

from slotserver.runtime import cpu_features
from slotserver.runtime.kv_spec import KVSpec
from slotserver.runtime.layouts import create_layout, load_layout
from slotserver.runtime.batch import Batch, SeqChunk
from slotserver.model.config import ModelConfig, resolve_dtype
from slotserver.model.gguf_file import GGUFFile
from slotserver.model.linear import Linear, QLinear
from slotserver.model.model import LlamaModel
from slotserver.model.weights import WeightFormat

QT = gguf.GGMLQuantizationType
TYPES = [QT.Q4_0, QT.Q4_1, QT.Q5_0, QT.Q5_1, QT.Q8_0, QT.Q4_K, QT.Q6_K, QT.F16, QT.F32]
TOKENS = [40, 72, 220, 300, 5, 17, 99, 250, 301, 7, 8]


def _tiny(tmp_path, qtype=QT.Q4_0, **kw):
    k_quant = qtype in (QT.Q4_K, QT.Q6_K)
    return write_tiny_gguf(tmp_path / f"{qtype.name}.gguf", tensor_type=qtype,
                           d_model=256 if k_quant else 64, d_ff=512 if k_quant else 128, **kw)


def _logits(model, tokens, one_by_one=False) -> torch.Tensor:
    """All-position logits of one sequence: one prefill, or one decode step per token."""
    s = model.spec
    cache = create_layout(load_layout("seq_head_dim"), KVSpec(s.n_layers, 1, 64, s.n_kv_heads, s.head_dim, model.dtype))
    if not one_by_one:
        return model.forward(Batch.build([SeqChunk(0, 0, tokens, all_logits=True)]), cache)
    return torch.cat([model.forward(Batch.build([SeqChunk(0, i, [t])]), cache) for i, t in enumerate(tokens)])


def _close(got: torch.Tensor, want: torch.Tensor, tol: float) -> None:
    err = float((got.float() - want).abs().max())
    assert err <= tol * float(want.abs().max()), f"max error {err:.3g} vs max |logit| {float(want.abs().max()):.3g}"


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_block_weights_give_the_float32_reference_logits(tmp_path, qtype):
    path = _tiny(tmp_path, qtype)
    want = _logits(LlamaModel.load(path, torch.float32), TOKENS)    # exact dequantized weights
    for dtype in (torch.float32, torch.bfloat16):
        model = LlamaModel.load(path, dtype, fmt=WeightFormat("q"))
        assert isinstance(model.weights.layers[0].down, QLinear) and isinstance(model.weights.output, QLinear)
        _close(_logits(model, TOKENS), want, 0.04)
        _close(_logits(model, TOKENS[:5], one_by_one=True), want[:5], 0.04)


def test_qwen2_neox_rope_and_biases_on_blocks(tmp_path):
    """q/k rows reordered for the normal-mode rope kernel (a row gather of whole blocks)."""
    path = _tiny(tmp_path, QT.Q8_0, arch="qwen2", qkv_bias=True)
    want = _logits(LlamaModel.load(path, torch.float32), TOKENS)
    _close(_logits(LlamaModel.load(path, torch.bfloat16, fmt=WeightFormat("q")), TOKENS), want, 0.04)


def test_matmul_weights_are_views_of_the_mapped_file(tmp_path):
    path = _tiny(tmp_path, QT.Q4_1)
    f = GGUFFile.open(path)
    size = path.stat().st_size
    model = LlamaModel.load(path, torch.bfloat16, fmt=WeightFormat("q"))
    lw, p, s = model.weights.layers[1], "blk.1.", model.spec
    # the model's mapping of the file starts here (layer 0's ffn_down is a view of its bytes)
    base = model.weights.layers[0].down.parts[0].raw.data_ptr() - f.tensors["blk.0.ffn_down.weight"].offset

    def file_offset(lin: QLinear) -> int:
        """Where the (single) part's bytes lie in the file; -1: not in the mapping (a copy)."""
        assert len(lin.parts) == 1
        return lin.parts[0].raw.data_ptr() - base if 0 <= lin.parts[0].raw.data_ptr() - base < size else -1

    assert file_offset(lw.down) == f.tensors[p + "ffn_down.weight"].offset
    assert file_offset(lw.wo) == f.tensors[p + "attn_output.weight"].offset
    gate, up = f.tensors[p + "ffn_gate.weight"], f.tensors[p + "ffn_up.weight"]
    if gate.offset + gate.n_bytes == up.offset:   # back to back in the file: one view, no copy
        assert file_offset(lw.gate_up) == gate.offset
    q, k, v = (f.tensors[p + n + ".weight"] for n in ("attn_q", "attn_k", "attn_v"))
    adjacent = q.offset + q.n_bytes == k.offset and k.offset + k.n_bytes == v.offset
    # this writer stores q, k, v back to back (one view); llama.cpp's converter does not (one copy)
    assert file_offset(lw.qkv) == (q.offset if adjacent else -1)
    assert lw.qkv.parts[0].n == (s.n_heads + 2 * s.n_kv_heads) * s.head_dim
    assert file_offset(model.weights.output) == f.tensors["token_embd.weight"].offset   # tied: the embedding's blocks


@pytest.mark.parametrize("qtype", [QT.Q4_1, QT.Q8_0, QT.Q6_K], ids=lambda t: t.name)
def test_warm_up_changes_no_answer(tmp_path, qtype):
    """The server's warmup (each block matmul once on zeros, before healthy, so the first request
    does not pay for preparing the weights) leaves every logit of the first request as without it,
    one decode step at a time too."""
    path = _tiny(tmp_path, qtype)
    cold = LlamaModel.load(path, torch.float32, fmt=WeightFormat("q"))
    warm = LlamaModel.load(path, torch.float32, fmt=WeightFormat("q"))
    warm.warm_up()
    assert torch.equal(_logits(warm, TOKENS[:5], one_by_one=True), _logits(cold, TOKENS[:5], one_by_one=True))
    assert torch.equal(_logits(warm, TOKENS), _logits(cold, TOKENS))


@pytest.mark.parametrize("qtype", [QT.Q5_1, QT.Q8_0], ids=lambda t: t.name)
def test_embedding_lookup_dequantizes_just_the_rows(tmp_path, qtype):
    """Q8_0 (most files' embedding) has its own torch path: the same floats as gguf's dequantizer."""
    path = _tiny(tmp_path, qtype)
    f = GGUFFile.open(path)
    dense = f.load_tensor("token_embd.weight")
    model = LlamaModel.load(path, torch.bfloat16, fmt=WeightFormat("q"))
    ids = torch.tensor([3, 0, 301, 3])
    assert torch.equal(model.weights.embed(ids), dense[ids])


def test_dequantized_formats_still_load(tmp_path):
    path = _tiny(tmp_path, QT.Q4_1)
    model = LlamaModel.load(path, torch.bfloat16, fmt=WeightFormat("auto8"))
    assert isinstance(model.weights.layers[0].qkv, Linear) and model.weights.layers[0].qkv.q8 is not None
    with pytest.raises(AssertionError, match="weights must be one of"):
        WeightFormat("int2")


def test_config_defaults_follow_the_cpu(tmp_path, monkeypatch):
    path = _tiny(tmp_path)
    cpu = cpu_features.current()
    native_bf16 = cpu.has("avx512_bf16") or cpu.amx
    serving = ModelConfig(model_path=path, dtype="auto")   # the CLI's default
    assert serving.weight_format.kind == "q"   # GGUF blocks on every CPU family
    # bf16 activations only for the dequantized formats, where the CPU computes bf16 natively
    assert serving.torch_dtype == torch.float32
    dense_auto = ModelConfig(model_path=path, dtype="auto", weights="dense")
    assert dense_auto.torch_dtype == (torch.bfloat16 if native_bf16 else torch.float32)
    assert ModelConfig(model_path=path).weight_format.kind == "dense"   # float32: the exact reference mode
    assert ModelConfig(model_path=path, dtype="float32", weights="q").weight_format.kind == "q"
    monkeypatch.setenv("SLOTSERVER_CPU", "avx2")   # an AVX2-only host: bf16 would be emulated
    assert resolve_dtype("auto") == "float32" and ModelConfig(model_path=path, dtype="auto").weight_format.kind == "q"


def test_amx_hosts_serve_every_file_from_its_blocks(tmp_path, monkeypatch):
    """On AMX too the default serves the GGUF blocks, Q4_1 files included (batch-invariant, and
    faster at decode than auto4 as measured, see ModelConfig.weight_format); auto4 on request."""
    amx = cpu_features.CpuFeatures("amx", cpu_features.host_flags() | cpu_features.AMX)
    monkeypatch.setattr(cpu_features, "current", lambda env=None: amx)
    q4_1, q4_k = _tiny(tmp_path, QT.Q4_1), _tiny(tmp_path, QT.Q4_K)
    assert ModelConfig(model_path=q4_1, dtype="auto").weight_format.kind == "q"
    assert ModelConfig(model_path=q4_k, dtype="auto").weight_format.kind == "q"
    assert ModelConfig(model_path=q4_1, dtype="auto").torch_dtype == torch.float32
    assert ModelConfig(model_path=q4_1, dtype="float32").weight_format.kind == "dense"   # the reference mode
    assert ModelConfig(model_path=q4_k, dtype="auto", weights="auto4").weight_format.kind == "auto4"   # asked for
