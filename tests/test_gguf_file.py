"""GGUFFile: the real default model opens, tiny models round-trip, bad files fail in one line."""

from __future__ import annotations

import struct
import time
import tracemalloc
from pathlib import Path
from typing import Callable

import gguf
import numpy as np
import pytest
import torch

from slotserver.model.default_model import default_model_path
from slotserver.model.gguf_file import GGUFError, GGUFFile
from tiny_gguf import tiny_vocab, tiny_weights, write_tiny_gguf

QT = gguf.GGMLQuantizationType
K_QUANTS = {QT.Q4_K, QT.Q6_K}
# worst |loaded - original| as a fraction of the tensor's max |value|, per storage type
TOLERANCE = {QT.F32: 0.0, QT.F16: 1e-3, QT.BF16: 8e-3, QT.Q8_0: 1e-2, QT.Q6_K: 3e-2,
             QT.Q5_0: 7e-2, QT.Q5_1: 5e-2, QT.Q4_0: 0.14, QT.Q4_1: 0.1, QT.Q4_K: 0.1}


@pytest.fixture(scope="module")
def smollm() -> GGUFFile:
    return GGUFFile.open(default_model_path())


def test_default_model_metadata_and_tensor_table(smollm):
    assert smollm.metadata["llama.block_count"] == 30
    assert smollm.metadata["general.architecture"] == "llama"
    tokens = smollm.metadata["tokenizer.ggml.tokens"]
    assert len(tokens) == 49152 and tokens[2] == "<|im_end|>"
    assert len(smollm.tensors) == 272
    embd = smollm.tensors["token_embd.weight"]
    assert embd.shape == (49152, 576) and embd.ggml_type == QT.Q8_0
    assert embd.n_bytes == 49152 * 576 // 32 * 34


def test_default_model_q4_1_tensor_loads_in_f32_and_bf16(smollm):
    info = smollm.require("blk.0.attn_k.weight", (192, 576))
    assert info.ggml_type == QT.Q4_1
    f32 = smollm.load_tensor(info.name)
    bf16 = smollm.load_tensor(info.name, torch.bfloat16)
    assert f32.shape == bf16.shape == (192, 576)
    assert f32.dtype == torch.float32 and bf16.dtype == torch.bfloat16 and bf16.is_contiguous()
    assert torch.isfinite(f32).all() and f32.std() > 1e-3
    assert (bf16.float() - f32).abs().max() <= 1e-2 * f32.abs().max()


def _tiny_kwargs(qtype: QT) -> dict:
    if qtype in K_QUANTS:  # K-quant rows must be multiples of 256
        return dict(n_layers=1, d_model=256, d_ff=256, n_heads=4, n_kv_heads=2)
    return dict(n_layers=2, d_model=64, d_ff=128, n_heads=4, n_kv_heads=2)


@pytest.mark.parametrize("qtype", list(TOLERANCE), ids=lambda q: q.name)
def test_tiny_model_round_trips_within_quantization_error(tmp_path, qtype):
    kwargs = _tiny_kwargs(qtype)
    path = write_tiny_gguf(tmp_path / f"tiny-{qtype.name}.gguf", tensor_type=qtype, **kwargs)
    model = GGUFFile.open(path)
    expected = tiny_weights(vocab_size=len(tiny_vocab()[0]), **kwargs)
    assert set(model.tensors) == set(expected)
    assert model.tensors["blk.0.ffn_down.weight"].ggml_type == qtype
    assert model.tensors["blk.0.ffn_norm.weight"].ggml_type == QT.F32
    for name, want in expected.items():
        got = model.load_tensor(name)
        assert got.shape == want.shape and got.dtype == torch.float32 and got.is_contiguous()
        worst = float(np.abs(got.numpy() - want).max() / np.abs(want).max())
        assert worst <= TOLERANCE[qtype], f"{name}: error {worst:.4f} of max |w|"
    got.add_(1.0)  # results are private copies, never views of the read-only mapping


def test_tiny_model_metadata_is_plain_python(tmp_path):
    path = write_tiny_gguf(tmp_path / "tiny.gguf", **{"llama.context_length": 512})
    meta = GGUFFile.open(path).metadata
    tokens, merges, types = tiny_vocab()
    assert meta["tokenizer.ggml.tokens"] == tokens and meta["tokenizer.ggml.merges"] == merges
    assert meta["tokenizer.ggml.token_type"] == types
    assert tokens[meta["tokenizer.ggml.eos_token_id"]] == "<|im_end|>"
    assert meta["tokenizer.ggml.add_bos_token"] is False
    assert meta["llama.context_length"] == 512 and meta["llama.rope.freq_base"] == 10000.0
    assert "<|im_start|>" in meta["tokenizer.chat_template"]


def test_tiny_model_variant_has_llama_cpp_tensor_shapes(tmp_path):
    path = write_tiny_gguf(tmp_path / "v.gguf", arch="qwen2", d_model=96, n_heads=6, n_kv_heads=2,
                           d_ff=160, tied_embeddings=False, qkv_bias=True, vocab_extra_merges=["Ġworld !"])
    model = GGUFFile.open(path)
    vocab = len(tiny_vocab()[0]) + 1
    assert model.metadata["general.architecture"] == "qwen2"
    assert model.metadata["qwen2.rope.dimension_count"] == 16
    assert model.metadata["tokenizer.ggml.tokens"][-4] == "Ġworld!"
    for name, shape in [("token_embd.weight", (vocab, 96)), ("output.weight", (vocab, 96)),
                        ("blk.0.attn_q.weight", (96, 96)), ("blk.0.attn_k.weight", (32, 96)),
                        ("blk.0.attn_q.bias", (96,)), ("blk.1.attn_v.bias", (32,)),
                        ("blk.1.ffn_gate.weight", (160, 96)), ("blk.1.ffn_down.weight", (96, 160))]:
        model.require(name, shape)


def test_require_and_load_report_missing_and_misshapen_tensors(tmp_path):
    model = GGUFFile.open(write_tiny_gguf(tmp_path / "tiny.gguf"))
    assert model.require("output_norm.weight", (64,)).n_bytes == 64 * 4
    with pytest.raises(GGUFError, match=r"tiny\.gguf: missing tensor output\.weight"):
        model.require("output.weight", (310, 64))
    with pytest.raises(GGUFError, match=r"has shape \(64,\), expected \(32,\)"):
        model.require("output_norm.weight", (32,))
    with pytest.raises(GGUFError, match="missing tensor nope"):
        model.load_tensor("nope")


def test_type_gguf_cannot_dequantize_is_reported_on_load(tmp_path):
    path = tmp_path / "q8_1.gguf"
    writer = gguf.GGUFWriter(path, "llama")
    block = gguf.GGML_QUANT_SIZES[QT.Q8_1][1]
    writer.add_tensor("odd.weight", np.zeros((2, block), np.uint8), raw_dtype=QT.Q8_1)
    writer.add_tensor("ok.weight", np.ones((2, 32), np.float32))
    for step in (writer.write_header_to_file, writer.write_kv_data_to_file, writer.write_tensors_to_file):
        step()
    writer.close()
    model = GGUFFile.open(path)  # the file is fine; only that tensor is unusable
    assert model.tensors["odd.weight"].shape == (2, 32)
    assert model.load_tensor("ok.weight").sum() == 64
    with pytest.raises(GGUFError, match="tensor odd.weight has unsupported type Q8_1"):
        model.load_tensor("odd.weight")


# ---- malformed files --------------------------------------------------------------------------


def _layout(data: bytes) -> dict[str, int]:
    """Byte offsets of interesting fields of a GGUF v3 file, keyed like 'key:<name>' or 'ti:<name>'."""
    pos, spots = 24, {}
    n_tensors, n_kv = struct.unpack_from("<QQ", data, 8)
    sizes = {0: 1, 1: 1, 7: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 10: 8, 11: 8, 12: 8}

    def skip_str(p: int) -> int:
        return p + 8 + struct.unpack_from("<Q", data, p)[0]

    for _ in range(n_kv):
        name = data[pos + 8:skip_str(pos)].decode()
        spots[f"key:{name}"], pos = pos, skip_str(pos)
        vtype = struct.unpack_from("<I", data, pos)[0]
        spots[f"value:{name}"], pos = pos + 4, pos + 4
        if vtype == 8:
            pos = skip_str(pos)
        elif vtype == 9:
            itype, count = struct.unpack_from("<IQ", data, pos)
            pos += 12
            for _ in range(count):
                pos = skip_str(pos) if itype == 8 else pos + sizes[itype]
        else:
            pos += sizes[vtype]
    spots["tensor_infos"] = pos
    for _ in range(n_tensors):
        name = data[pos + 8:skip_str(pos)].decode()
        spots[f"ti:{name}"], pos = pos, skip_str(pos)
        n_dims = struct.unpack_from("<I", data, pos)[0]
        spots[f"dims:{name}"] = pos + 4
        spots[f"type:{name}"] = pos + 4 + 8 * n_dims
        spots[f"offset:{name}"], pos = pos + 8 + 8 * n_dims, pos + 16 + 8 * n_dims
    return spots


def _put(data: bytearray, at: int, fmt: str, value) -> bytearray:
    struct.pack_into(fmt, data, at, value)
    return data


def _rename(data: bytearray, at: int, new: bytes) -> bytearray:
    """Overwrite the string stored at `at` (u64 length, then bytes) with a same-length one."""
    assert struct.unpack_from("<Q", data, at)[0] == len(new)
    data[at + 8:at + 8 + len(new)] = new
    return data


Q = "blk.0.attn_q.weight"
MALFORMED: dict[str, tuple[Callable[[bytearray, dict], bytes], str]] = {
    "empty": (lambda d, s: b"", "truncated GGUF header (0 bytes"),
    "short header": (lambda d, s: d[:20], "truncated GGUF header (20 bytes"),
    "wrong magic": (lambda d, s: b"GGML" + d[4:], "not a GGUF file (magic b'GGML')"),
    "version 1": (lambda d, s: _put(d, 4, "<I", 1), "unsupported GGUF version 1"),
    "version 99": (lambda d, s: _put(d, 4, "<I", 99), "unsupported GGUF version 99"),
    "big-endian": (lambda d, s: _put(d, 4, ">I", 3), "big-endian GGUF files are not supported"),
    "tensor count": (lambda d, s: _put(d, 8, "<Q", 2**63), "impossible tensor count"),
    "kv count": (lambda d, s: _put(d, 16, "<Q", 2**40), "impossible metadata count"),
    "metadata cut off": (lambda d, s: d[:s["key:tokenizer.ggml.merges"]], "corrupt or truncated metadata"),
    "tensor info cut off": (lambda d, s: d[:s[f"ti:{Q}"] + 12], "corrupt or truncated tensor info"),
    "tensor data cut off": (lambda d, s: d[:-100], "lies outside the file"),
    "huge key length": (lambda d, s: _put(d, 24, "<Q", 2**60),
                        f"metadata key #0 of length {2**60} needs {2**60} bytes"),
    "huge string value": (lambda d, s: _put(d, s["value:general.name"], "<Q", 2**60),
                          "string value of general.name"),
    "huge string array": (lambda d, s: _put(d, s["value:tokenizer.ggml.tokens"] + 4, "<Q", 2**60),
                          "string array tokenizer.ggml.tokens"),
    "huge string in array": (lambda d, s: _put(d, s["value:tokenizer.ggml.tokens"] + 12, "<Q", 2**60),
                             "string in tokenizer.ggml.tokens"),
    "huge int array": (lambda d, s: _put(d, s["value:tokenizer.ggml.token_type"] + 4, "<Q", 2**61),
                       "item array tokenizer.ggml.token_type"),
    "unknown value type": (lambda d, s: _put(d, s["value:general.name"] - 4, "<I", 77),
                           "unknown value type 77"),
    "duplicate key": (lambda d, s: _rename(d, s["key:tokenizer.ggml.eos_token_id"],
                                           b"tokenizer.ggml.bos_token_id"),
                      "duplicate metadata key tokenizer.ggml.bos_token_id"),
    "value not utf-8": (lambda d, s: _put(d, s["value:general.name"] + 8, "<B", 0xFF),
                        "string value of general.name at offset"),
    "name not utf-8": (lambda d, s: _put(d, s[f"ti:{Q}"] + 8, "<B", 0xFF), "is not UTF-8"),
    "too many dims": (lambda d, s: _put(d, s[f"dims:{Q}"] - 4, "<I", 9), "has 9 dimensions"),
    "unknown tensor type": (lambda d, s: _put(d, s[f"type:{Q}"], "<I", 99), f"{Q} has unknown type id 99"),
    "offset past end": (lambda d, s: _put(d, s[f"offset:{Q}"], "<Q", 2**40), "lies outside the file"),
    "misaligned offset": (lambda d, s: _put(d, s[f"offset:{Q}"], "<Q", 4), "is not aligned to 32"),
    "overlapping data": (lambda d, s: _put(d, s[f"offset:{Q}"], "<Q", 0), "overlaps tensor"),
    "shape too big for data": (lambda d, s: _put(d, s[f"dims:{Q}"] + 8, "<Q", 2**50),
                               "lies outside the file"),
    "rows not whole blocks": (lambda d, s: _put(_put(d, s[f"type:{Q}"], "<I", int(QT.Q8_0)),
                                                s[f"dims:{Q}"], "<Q", 48),
                              "rows (48) are not a multiple of the Q8_0 block size 32"),
    "duplicate tensor": (lambda d, s: _rename(d, s["ti:blk.0.attn_v.weight"], b"blk.0.attn_k.weight"),
                         "duplicate tensor name blk.0.attn_k.weight"),
}


@pytest.fixture(scope="module")
def tiny_bytes(tmp_path_factory) -> bytes:
    return write_tiny_gguf(tmp_path_factory.mktemp("base") / "base.gguf", n_layers=1).read_bytes()


def _open_error(path: Path) -> str:
    """Open a bad file; return the one-line message after checking it failed fast and small."""
    tracemalloc.start()
    start = time.perf_counter()
    try:
        with pytest.raises(GGUFError) as caught:
            GGUFFile.open(path)
        elapsed = time.perf_counter() - start
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    message = str(caught.value)
    assert "\n" not in message and message.startswith(f"{path}: ")
    assert elapsed < 1.0 and peak < 32 * 2**20, (elapsed, peak)
    return message


@pytest.mark.parametrize("case", list(MALFORMED))
def test_malformed_file_gives_one_clear_line(tmp_path, tiny_bytes, case):
    mutate, phrase = MALFORMED[case]
    path = tmp_path / "bad-model.gguf"
    path.write_bytes(bytes(mutate(bytearray(tiny_bytes), _layout(tiny_bytes))))
    assert phrase in _open_error(path)


def test_missing_path_and_directory_are_named(tmp_path):
    assert "file not found" in _open_error(tmp_path / "absent.gguf")
    assert "is a directory: give a GGUF file" in _open_error(tmp_path)   # not "not found", not "not a regular file"


def test_custom_alignment_is_honoured_and_checked(tmp_path):
    path = tmp_path / "align.gguf"
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_custom_alignment(64)
    writer.add_tensor("a", np.arange(3, dtype=np.float32))
    writer.add_tensor("b", np.ones(8, np.float32))
    for step in (writer.write_header_to_file, writer.write_kv_data_to_file, writer.write_tensors_to_file):
        step()
    writer.close()
    model = GGUFFile.open(path)
    assert model.tensors["b"].offset - model.tensors["a"].offset == 64
    assert model.load_tensor("b").tolist() == [1.0] * 8
    data = bytearray(path.read_bytes())
    _put(data, _layout(data)["value:general.alignment"], "<I", 48)
    path.write_bytes(data)
    assert "invalid general.alignment 48" in _open_error(path)


def test_metadata_equals_gguf_readers(smollm_path):
    """Our own metadata walk (GGUFReader is too slow for large vocabularies) reads exactly what the
    gguf package reads: every key, every value, the same Python types; tensor bytes at the same offsets."""
    reader = gguf.GGUFReader(smollm_path)
    want_md = {key: field.contents() for key, field in reader.fields.items()}
    f = GGUFFile.open(smollm_path)
    assert f.metadata.keys() == want_md.keys()
    for key, want in want_md.items():
        got = f.metadata[key]
        assert type(got) is type(want) and got == want, key
    for t in reader.tensors:
        info = f.tensors[t.name]
        assert (info.offset, info.n_bytes) == (t.data_offset, t.n_bytes)
        assert bytes(f.mapped_bytes(info.offset, 64)) == t.data.reshape(-1).view("u1")[:64].tobytes()
