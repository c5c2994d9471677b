"""Write a random-weight GGUF of a real model's shape, to time on a machine without the real file.

A GPU machine lent for minutes has no network: it builds its own test models. Timing depends on
the shapes and the block formats, not on the values, so the weights are random *valid* blocks:
random quant bytes with every block's float16 scale(s) set to a small normal value (no NaN/inf
can appear). The vocabulary is the tiny byte-level BPE of tests/tiny_gguf.py padded with unused
tokens up to the real size, so the output matmul and the sampler see the real vocabulary width.

    python playground/shape_model.py qwen2.5-0.5b Q4_K out.gguf    # shapes: SHAPES below
    python playground/shape_model.py llama-3.1-8b Q4_K_M out.gguf  # llama-quantize's Q4_K_M mix
    python playground/shape_model.py tiny BF16 out.gguf             # seconds, for CPU dry runs

A single type (Q4_K, Q8_0, BF16...) stores every matmul in it (K-quant rows that are not whole
super-blocks take llama.cpp's fallback). `Q4_K_M` is the mix users download, as llama.cpp's
llama-quant.cpp makes it: Q4_K, but Q6_K for the output matmul (the token embedding where it is
tied) and for attn_v and ffn_down in the layers `use_more_bits` picks (the first and last eighth,
and every third between), with the same fallbacks (Qwen2.5-0.5B's 896-wide rows: Q5_0 and Q8_0).

Needs numpy and gguf-py (a GPU image may lack gguf: carry its wheel, see gpu_check.sh).
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from tiny_gguf import BOS_TOKEN, CHATML, EOS_TOKEN, tiny_vocab  # noqa: E402

QT = gguf.GGMLQuantizationType
VT = gguf.GGUFValueType


@dataclass(frozen=True)
class Shape:
    arch: str
    n_layers: int
    d_model: int
    n_heads: int
    n_kv_heads: int
    d_ff: int
    vocab: int
    qkv_bias: bool = False
    tied: bool = True
    rope_base: float = 1e6
    ctx: int = 32768


SHAPES = {
    "qwen2.5-0.5b": Shape("qwen2", 24, 896, 14, 2, 4864, 151936, qkv_bias=True),
    "llama-3.1-8b": Shape("llama", 32, 4096, 32, 8, 14336, 128256, tied=False, rope_base=5e5, ctx=131072),
    "smollm2-135m": Shape("llama", 30, 576, 9, 3, 1536, 49152, rope_base=1e5, ctx=8192),
    "tiny": Shape("llama", 2, 256, 4, 2, 512, 512, rope_base=1e4, ctx=2048),
}

# byte offsets of each block's float16 scales, per format (ggml's block structs)
SCALE_OFFSETS = {QT.Q4_0: (0,), QT.Q4_1: (0, 2), QT.Q5_0: (0,), QT.Q5_1: (0, 2), QT.Q8_0: (0,),
                 QT.Q2_K: (80, 82), QT.Q3_K: (108,), QT.Q4_K: (0, 2), QT.Q5_K: (0, 2), QT.Q6_K: (208,)}


# llama.cpp's fallback where a row is not a multiple of 256 (Qwen2.5-0.5B's 896): llama-quant.cpp
K_FALLBACK = {QT.Q2_K: QT.Q4_0, QT.Q3_K: QT.Q4_0, QT.Q4_K: QT.Q5_0, QT.Q5_K: QT.Q5_1, QT.Q6_K: QT.Q8_0}


def stored_type(qtype: QT, n_in: int) -> QT:
    return K_FALLBACK[qtype] if n_in % gguf.GGML_QUANT_SIZES[qtype][0] else qtype


def random_tensor(rng: np.random.Generator, n_out: int, n_in: int, qtype: QT) -> np.ndarray:
    """[n_out, n_in] weights as `qtype`: random valid blocks (quantized) or N(0, 1/n_in) floats."""
    if qtype in (QT.F32, QT.F16, QT.BF16):
        w = (rng.standard_normal((n_out, n_in), dtype=np.float32) / np.sqrt(n_in)).astype(np.float32)
        if qtype == QT.BF16:   # the top halves of the float32s: uint16 [n_out, n_in]
            return (w.view(np.uint32) >> 16).astype(np.uint16)
        return w.astype(np.float16 if qtype == QT.F16 else np.float32)
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, (n_out, n_in // block, size), dtype=np.uint8)
    scale = np.array([1.0 / (np.sqrt(n_in) * 8)], np.float16).view(np.uint8)   # values ~ N(0, 1/n_in)-ish
    for off in SCALE_OFFSETS[qtype]:
        raw[:, :, off], raw[:, :, off + 1] = scale[0], scale[1]
    return raw.reshape(n_out, -1)


def use_more_bits(i_layer: int, n_layers: int) -> bool:
    """llama-quant.cpp's rule for the layers whose attn_v / ffn_down a *_M mix stores with more bits."""
    return i_layer < n_layers // 8 or i_layer >= 7 * n_layers // 8 or (i_layer - n_layers // 8) % 3 == 2


def mix_type(mix: str, name: str, s: Shape) -> QT:
    """The type `mix` (a GGML type's name, or Q4_K_M) gives tensor `name` before the fallbacks."""
    if mix != "Q4_K_M":
        return QT[mix]
    if name == "output.weight" or (name == "token_embd.weight" and s.tied):
        return QT.Q6_K
    layer = int(name.split(".")[1]) if name.startswith("blk.") else -1
    if name.endswith(("attn_v.weight", "ffn_down.weight")) and use_more_bits(layer, s.n_layers):
        return QT.Q6_K
    return QT.Q4_K


def tensors(s: Shape, mix: str, seed: int = 0):
    """(name, array, raw_dtype or None) in llama.cpp's order; `mix`: a GGML type's name or Q4_K_M."""
    rng = np.random.default_rng(seed)
    hd = s.d_model // s.n_heads
    def mat(name: str, n_out: int, n_in: int):
        t = stored_type(mix_type(mix, name, s), n_in)
        return name, random_tensor(rng, n_out, n_in, t), t

    yield mat("token_embd.weight", s.vocab, s.d_model)
    for i in range(s.n_layers):
        b = f"blk.{i}."
        yield b + "attn_norm.weight", np.ones(s.d_model, np.float32), None
        for name, n_out in (("attn_q", s.n_heads * hd), ("attn_k", s.n_kv_heads * hd), ("attn_v", s.n_kv_heads * hd)):
            yield mat(b + name + ".weight", n_out, s.d_model)
            if s.qkv_bias:
                yield b + name + ".bias", (0.02 * rng.standard_normal(n_out)).astype(np.float32), None
        yield mat(b + "attn_output.weight", s.d_model, s.n_heads * hd)
        yield b + "ffn_norm.weight", np.ones(s.d_model, np.float32), None
        yield mat(b + "ffn_gate.weight", s.d_ff, s.d_model)
        yield mat(b + "ffn_up.weight", s.d_ff, s.d_model)
        yield mat(b + "ffn_down.weight", s.d_model, s.d_ff)
    yield "output_norm.weight", np.ones(s.d_model, np.float32), None
    if not s.tied:
        yield mat("output.weight", s.vocab, s.d_model)


def metadata(s: Shape) -> dict:
    tokens, merges, types = tiny_vocab()
    pad = s.vocab - len(tokens)
    if pad < 0:
        raise ValueError(f"vocabulary {s.vocab} is smaller than the tiny BPE's {len(tokens)}")
    # NORMAL tokens with text (never produced by encoding, no merge makes them): a random model
    # samples them all the time, and a client counting streamed text must see text
    tokens, types = tokens + [f"w{i}" for i in range(pad)], types + [1] * pad
    a = s.arch
    return {
        "general.name": (f"random {a} shape", VT.STRING), f"{a}.block_count": (s.n_layers, VT.UINT32),
        f"{a}.context_length": (s.ctx, VT.UINT32), f"{a}.embedding_length": (s.d_model, VT.UINT32),
        f"{a}.feed_forward_length": (s.d_ff, VT.UINT32), f"{a}.attention.head_count": (s.n_heads, VT.UINT32),
        f"{a}.attention.head_count_kv": (s.n_kv_heads, VT.UINT32), f"{a}.rope.freq_base": (s.rope_base, VT.FLOAT32),
        f"{a}.attention.layer_norm_rms_epsilon": (1e-6, VT.FLOAT32),
        f"{a}.rope.dimension_count": (s.d_model // s.n_heads, VT.UINT32),
        "tokenizer.ggml.model": ("gpt2", VT.STRING), "tokenizer.ggml.pre": ("gpt2", VT.STRING),
        "tokenizer.ggml.tokens": (tokens, VT.ARRAY), "tokenizer.ggml.token_type": (types, VT.ARRAY),
        "tokenizer.ggml.merges": (merges, VT.ARRAY),
        "tokenizer.ggml.bos_token_id": (tokens.index(BOS_TOKEN), VT.UINT32),
        "tokenizer.ggml.eos_token_id": (tokens.index(EOS_TOKEN), VT.UINT32),
        "tokenizer.ggml.add_bos_token": (False, VT.BOOL), "tokenizer.chat_template": (CHATML, VT.STRING),
        "general.quantization_version": (2, VT.UINT32),
    }


def write(shape: str, qtype_name: str, path: Path, seed: int = 0) -> Path:
    s = SHAPES[shape]
    mix_type(qtype_name, "blk.0.attn_q.weight", s)   # an unknown name fails here, before the file
    w = gguf.GGUFWriter(path, s.arch)
    w.kv_data[0].clear()
    w.add_key_value("general.architecture", s.arch, VT.STRING)
    for key, (value, vtype) in metadata(s).items():
        w.add_key_value(key, value, vtype)
    for name, arr, raw in tensors(s, qtype_name, seed):
        if raw is None or raw == QT.F32:
            w.add_tensor(name, arr)
        else:
            w.add_tensor(name, arr, raw_dtype=raw)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("shape", choices=sorted(SHAPES))
    p.add_argument("qtype", help="Q4_K, Q8_0, BF16, F16, Q4_0, Q6_K, ... or the Q4_K_M mix")
    p.add_argument("out", type=Path)
    a = p.parse_args()
    print(write(a.shape, a.qtype, a.out))


if __name__ == "__main__":
    main()
