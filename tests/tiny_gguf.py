"""Write tiny random llama-family GGUF models for tests (a helper module, not a test module).

The files look like what llama.cpp's converter writes: llama metadata keys, llama.cpp tensor
names, and a real byte-level GPT-2 BPE vocabulary, so loaders, tokenizers and chat templating can
be exercised end to end in milliseconds. Token ids are stable:

- 0..255: the 256 byte tokens, in GPT-2's `bytes_to_unicode` order ("!" is 0, "Ġ" (space) is 220),
- then one token per merge, in merge order (`DEFAULT_MERGES`, then `vocab_extra_merges`),
- then the specials `<|endoftext|>` (bos/padding), `<|im_start|>`, `<|im_end|>` (eos: ChatML ends
  every turn with it, so generation stops there), all with token type CONTROL,
- then `extra_specials`, if given (also CONTROL; e.g. `FIM_SPECIALS`, Qwen2.5-Coder's FIM tokens,
  which llama.cpp finds by their text).

Weights are seeded normal draws scaled by 1/sqrt(fan_in) (embeddings 2/sqrt(d_model), so tied
logits have a std of about 2), norms are ones. `tiny_weights` returns the exact float32 values
that `write_tiny_gguf` stores before quantization, for round-trip checks.

`features` adds what other architectures carry (every one with random, non-unit values, so a
tensor read in the wrong order shows): "qk_norm" (attn_q_norm/attn_k_norm), "post_norms"
(post_attention_norm/post_ffw_norm), "fused" (phi3's attn_qkv and gate|up in ffn_up),
"rope_factors" (phi3's rope_factors_long/short), "rope_freqs" (llama3's rope_freqs);
`head_dim` sets attention.key_length apart from d_model / n_heads.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Sequence

import gguf
import numpy as np

QT = gguf.GGMLQuantizationType
VT = gguf.GGUFValueType

CHATML = (  # literal newlines inside the Jinja strings, as in SmolLM2's template
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content']"
    " + '<|im_end|>' + '\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
BOS_TOKEN, EOS_TOKEN = "<|endoftext|>", "<|im_end|>"
FIM_SPECIALS = ("<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>",
                "<|file_sep|>")   # Qwen2.5-Coder's texts: pre, mid, suf, pad, rep, sep
DEFAULT_MERGES = (
    "Ġ t", "h e", "i n", "Ġ a", "e r", "o n", "Ġt he", "r e", "a t", "e n", "o r", "Ġ s",
    "Ġ w", "Ġ o", "e s", "Ġ c", "i s", "i t", "a n", "Ġ b", "Ġ f", "Ġ m", "Ġ p", "a l",
    "a r", "in g", "Ġ h", "o u", "l l", "Ġ i", "e d", "Ġ d", "Ġo f", "n d", "Ġa nd", "Ġt o",
    "Ġ in", "Ġ is", "Ġ it", "Ġ y", "Ġy ou", "Ġh e", "l o", "Ġ l", "Ġ H", "e l", "el lo",
    "Ġw or", "l d", "Ġwor ld", "ĠH ello",
)


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map, in GPT-2's vocabulary order."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    bs += list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, (chr(c) for c in cs)))


def tiny_vocab(extra_merges: Sequence[str] = (),
               extra_specials: Sequence[str] = ()) -> tuple[list[str], list[str], list[int]]:
    """(tokens, merges, token_types) of the tiny vocabulary; merges must build on known tokens."""
    tokens = list(bytes_to_unicode().values())
    merges = list(DEFAULT_MERGES) + list(extra_merges)
    known = set(tokens)
    for merge in merges:
        left, right = merge.split(" ")
        if left not in known or right not in known or left + right in known:
            raise ValueError(f"merge {merge!r} must join two known tokens into a new one")
        tokens.append(left + right)
        known.add(left + right)
    specials = list(SPECIAL_TOKENS) + list(extra_specials)
    types = [int(gguf.TokenType.NORMAL)] * len(tokens) + [int(gguf.TokenType.CONTROL)] * len(specials)
    return tokens + specials, merges, types


FEATURES = ("qk_norm", "post_norms", "fused", "rope_factors", "rope_freqs")


def tiny_weights(*, n_layers: int = 2, d_model: int = 64, n_heads: int = 4, n_kv_heads: int = 2,
                 d_ff: int = 128, vocab_size: int, tied_embeddings: bool = True,
                 qkv_bias: bool = False, seed: int = 0, head_dim: int | None = None,
                 features: Sequence[str] = ()) -> dict[str, np.ndarray]:
    """The float32 weights by llama.cpp name, in numpy order (n_out, n_in), in file order."""
    if (head_dim is None and d_model % n_heads) or n_heads % n_kv_heads:
        raise ValueError("d_model must divide by n_heads and n_heads by n_kv_heads")
    if set(features) - set(FEATURES):
        raise ValueError(f"unknown features {set(features) - set(FEATURES)}")
    rng = np.random.default_rng(seed)
    hd = head_dim or d_model // n_heads

    def linear(n_out: int, n_in: int) -> np.ndarray:
        return (rng.standard_normal((n_out, n_in)) / np.sqrt(n_in)).astype(np.float32)

    def norm(n: int) -> np.ndarray:
        return (1 + 0.3 * rng.standard_normal(n)).astype(np.float32)

    w = {"token_embd.weight": linear(vocab_size, d_model) * 2}
    if "rope_freqs" in features:
        w["rope_freqs.weight"] = (1 + 7 * rng.random(hd // 2)).astype(np.float32)
    if "rope_factors" in features:
        for kind in ("long", "short"):
            w[f"rope_factors_{kind}.weight"] = (1 + 3 * rng.random(hd // 2)).astype(np.float32)
    for i in range(n_layers):
        b = f"blk.{i}."
        w[b + "attn_norm.weight"] = np.ones(d_model, np.float32)
        if "fused" in features:
            w[b + "attn_qkv.weight"] = linear((n_heads + 2 * n_kv_heads) * hd, d_model)
        else:
            w[b + "attn_q.weight"] = linear(n_heads * hd, d_model)  # (n_heads*hd, d_model)
            w[b + "attn_k.weight"] = linear(n_kv_heads * hd, d_model)  # (n_kv*hd, d_model)
            w[b + "attn_v.weight"] = linear(n_kv_heads * hd, d_model)
        if qkv_bias:
            for proj, n_out in (("q", n_heads * hd), ("k", n_kv_heads * hd), ("v", n_kv_heads * hd)):
                w[b + f"attn_{proj}.bias"] = (rng.standard_normal(n_out) * 0.02).astype(np.float32)
        if "qk_norm" in features:
            w[b + "attn_q_norm.weight"], w[b + "attn_k_norm.weight"] = norm(hd), norm(hd)
        w[b + "attn_output.weight"] = linear(d_model, n_heads * hd)
        if "post_norms" in features:
            w[b + "post_attention_norm.weight"] = norm(d_model)
        w[b + "ffn_norm.weight"] = np.ones(d_model, np.float32)
        if "fused" in features:
            w[b + "ffn_up.weight"] = linear(2 * d_ff, d_model)  # gate rows, then up rows
        else:
            w[b + "ffn_gate.weight"] = linear(d_ff, d_model)  # (d_ff, d_model)
            w[b + "ffn_up.weight"] = linear(d_ff, d_model)
        w[b + "ffn_down.weight"] = linear(d_model, d_ff)  # (d_model, d_ff)
        if "post_norms" in features:
            w[b + "post_ffw_norm.weight"] = norm(d_model)
    w["output_norm.weight"] = np.ones(d_model, np.float32)
    if not tied_embeddings:
        w["output.weight"] = linear(vocab_size, d_model) * 2
    return w


def _k_blocks(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float32).reshape(-1, gguf.QK_K)  # (n_blocks, 256)


def _quantize_q6_k(x: np.ndarray) -> np.ndarray:
    """Simple (not optimal) Q6_K: value = d * scale[j] * q, q in [-32, 31], 16 groups of 16."""
    blocks = _k_blocks(x)
    nb = blocks.shape[0]
    groups = blocks.reshape(nb, 16, 16)
    group_scale = np.abs(groups).max(axis=-1) / 31  # (nb, 16)
    d = (group_scale.max(axis=-1, keepdims=True) / 127).astype(np.float16)  # (nb, 1)
    d32 = d.astype(np.float32)
    sc = np.clip(np.round(np.divide(group_scale, d32, out=np.zeros_like(group_scale), where=d32 > 0)), 0, 127)
    step = (d32 * sc)[..., None]  # (nb, 16, 1)
    q = np.clip(np.round(np.divide(groups, step, out=np.zeros_like(groups), where=step > 0)), -32, 31)
    q = (q + 32).astype(np.uint8).reshape(nb, 256)
    low, high = (q & 0xF).reshape(nb, 2, 2, 64), (q >> 4).reshape(nb, 2, 4, 32)
    ql = (low[:, :, 0] | (low[:, :, 1] << 4)).reshape(nb, 128)
    qh = (high[:, :, 0] | (high[:, :, 1] << 2) | (high[:, :, 2] << 4) | (high[:, :, 3] << 6)).reshape(nb, 64)
    parts = [ql, qh, sc.astype(np.int8).view(np.uint8), d.view(np.uint8)]
    return np.concatenate(parts, axis=-1).reshape(*x.shape[:-1], -1)


def _quantize_q4_k(x: np.ndarray) -> np.ndarray:
    """Simple Q4_K: value = d * sc[j] * q - dmin * m[j], q in [0, 15], 8 groups of 32."""
    blocks = _k_blocks(x)
    nb = blocks.shape[0]
    groups = blocks.reshape(nb, 8, 32)
    mins = np.maximum(0, -groups.min(axis=-1))  # (nb, 8) subtracted offsets
    scales = (groups.max(axis=-1) + mins) / 15
    d = (scales.max(axis=-1, keepdims=True) / 63).astype(np.float16)
    dmin = (mins.max(axis=-1, keepdims=True) / 63).astype(np.float16)
    d32, dmin32 = d.astype(np.float32), dmin.astype(np.float32)
    sc = np.clip(np.round(np.divide(scales, d32, out=np.zeros_like(scales), where=d32 > 0)), 0, 63)
    m = np.clip(np.round(np.divide(mins, dmin32, out=np.zeros_like(mins), where=dmin32 > 0)), 0, 63)
    step, offset = (d32 * sc)[..., None], (dmin32 * m)[..., None]
    shifted = groups + offset
    q = np.clip(np.round(np.divide(shifted, step, out=np.zeros_like(shifted), where=step > 0)), 0, 15)
    q = q.astype(np.uint8).reshape(nb, 4, 2, 32)
    qs = (q[:, :, 0] | (q[:, :, 1] << 4)).reshape(nb, 128)
    sc, m = sc.astype(np.uint8), m.astype(np.uint8)
    packed = [sc[:, :4] | ((sc[:, 4:] & 0x30) << 2), m[:, :4] | ((m[:, 4:] & 0x30) << 2),
              (sc[:, 4:] & 0xF) | ((m[:, 4:] & 0xF) << 4)]
    parts = [d.view(np.uint8), dmin.view(np.uint8), *packed, qs]
    return np.concatenate(parts, axis=-1).reshape(*x.shape[:-1], -1)


def quantize(x: np.ndarray, qtype: QT) -> np.ndarray:
    """Encode float32 `x` as `qtype` (gguf.quants, plus simple Q4_K/Q6_K encoders it lacks)."""
    block = gguf.GGML_QUANT_SIZES[qtype][0]
    if x.shape[-1] % block:
        raise ValueError(f"{qtype.name} needs rows that are a multiple of {block}, got {x.shape}")
    encoders = {QT.Q4_K: _quantize_q4_k, QT.Q6_K: _quantize_q6_k}
    if qtype in encoders:
        return encoders[qtype](x)
    return gguf.quants.quantize(x, qtype)


def _metadata(arch: str, *, n_layers: int, d_model: int, n_heads: int, n_kv_heads: int, d_ff: int,
              rope_base: float, ctx_len: int, rms_eps: float, chat_template: str,
              vocab: tuple[list[str], list[str], list[int]], head_dim: int | None = None) -> dict[str, tuple[Any, VT]]:
    tokens, merges, types = vocab
    hd = {} if head_dim is None else {f"{arch}.attention.key_length": (head_dim, VT.UINT32),
                                      f"{arch}.attention.value_length": (head_dim, VT.UINT32)}
    return hd | {
        "general.name": (f"tiny-{arch}", VT.STRING),
        f"{arch}.block_count": (n_layers, VT.UINT32),
        f"{arch}.context_length": (ctx_len, VT.UINT32),
        f"{arch}.embedding_length": (d_model, VT.UINT32),
        f"{arch}.feed_forward_length": (d_ff, VT.UINT32),
        f"{arch}.attention.head_count": (n_heads, VT.UINT32),
        f"{arch}.attention.head_count_kv": (n_kv_heads, VT.UINT32),
        f"{arch}.rope.freq_base": (rope_base, VT.FLOAT32),
        f"{arch}.attention.layer_norm_rms_epsilon": (rms_eps, VT.FLOAT32),
        f"{arch}.rope.dimension_count": (head_dim or d_model // n_heads, VT.UINT32),
        f"{arch}.vocab_size": (len(tokens), VT.UINT32),
        "tokenizer.ggml.model": ("gpt2", VT.STRING),
        "tokenizer.ggml.pre": ("gpt2", VT.STRING),
        "tokenizer.ggml.tokens": (tokens, VT.ARRAY),
        "tokenizer.ggml.token_type": (types, VT.ARRAY),
        "tokenizer.ggml.merges": (merges, VT.ARRAY),
        "tokenizer.ggml.bos_token_id": (tokens.index(BOS_TOKEN), VT.UINT32),
        "tokenizer.ggml.eos_token_id": (tokens.index(EOS_TOKEN), VT.UINT32),
        "tokenizer.ggml.padding_token_id": (tokens.index(BOS_TOKEN), VT.UINT32),
        "tokenizer.ggml.add_bos_token": (False, VT.BOOL),
        "tokenizer.chat_template": (chat_template, VT.STRING),
        "general.quantization_version": (2, VT.UINT32),
    }


def write_tiny_gguf(path: str | os.PathLike, *, arch: str = "llama", n_layers: int = 2,
                    d_model: int = 64, n_heads: int = 4, n_kv_heads: int = 2, d_ff: int = 128,
                    vocab_extra_merges: Sequence[str] = (), tensor_type: QT = QT.F32,
                    tied_embeddings: bool = True, rope_base: float = 10000.0, ctx_len: int = 256,
                    seed: int = 0, qkv_bias: bool = False, chat_template: str = CHATML,
                    rms_eps: float = 1e-5, head_dim: int | None = None, features: Sequence[str] = (),
                    extra_specials: Sequence[str] = (), transform: Any = None, split_max_tensors: int = 0,
                    small_first_shard: bool = False, **overrides: Any) -> Path:
    """Write a tiny random model to `path` and return it as a Path.

    2-D weights are stored as `tensor_type` (quantized types need d_model and d_ff to be
    multiples of the block size: 32, or 256 for K-quants); 1-D norms and biases stay F32.
    `features`, `head_dim` and `extra_specials`: see the module docstring.
    `transform`: called with the float32 weights dict before they are written, returns the dict to
    write (tests/tiny_lora.py writes a model with LoRA deltas merged into it).
    `split_max_tensors`: a split GGUF of parts of at most that many tensors, written by gguf-py as the
    converters write one (`path`'s stem + `-00001-of-0000N.gguf`...); the first part's path is returned.
    `small_first_shard`: that first part holds the metadata alone (the converters' --no-tensor-first-split).
    `overrides` maps full metadata keys (pass them as `**{"llama.context_length": 512}`) to new
    values, keeping a known key's value type (a new key: int32, float32 or string, unless given as
    a `(value, GGUFValueType)` pair); a value of None removes the key.
    """
    vocab = tiny_vocab(vocab_extra_merges, extra_specials)
    meta = {"general.architecture": (arch, VT.STRING)}
    meta |= _metadata(arch, n_layers=n_layers, d_model=d_model, n_heads=n_heads,
                     n_kv_heads=n_kv_heads, d_ff=d_ff, rope_base=rope_base, ctx_len=ctx_len,
                     rms_eps=rms_eps, chat_template=chat_template, vocab=vocab, head_dim=head_dim)
    weights = tiny_weights(n_layers=n_layers, d_model=d_model, n_heads=n_heads,
                           n_kv_heads=n_kv_heads, d_ff=d_ff, vocab_size=len(vocab[0]),
                           tied_embeddings=tied_embeddings, qkv_bias=qkv_bias, seed=seed,
                           head_dim=head_dim, features=features)
    if transform is not None:
        weights = transform(weights)
    writer = gguf.GGUFWriter(Path(path), arch, split_max_tensors=split_max_tensors, small_first_shard=small_first_shard)
    for key, value in overrides.items():
        if value is None:
            meta.pop(key, None)
        elif isinstance(value, tuple):   # (value, GGUFValueType): a new key of an explicit type
            meta[key] = value
        else:
            meta[key] = (value, meta[key][1] if key in meta else VT.get_type(value))
    writer.kv_data[0].clear()  # the writer pre-adds general.architecture; `meta` decides
    for key, (value, vtype) in meta.items():
        writer.add_key_value(key, value, vtype)
    for name, w in weights.items():
        if w.ndim == 1 or tensor_type == QT.F32:
            writer.add_tensor(name, w)
        else:
            writer.add_tensor(name, quantize(w, tensor_type), raw_dtype=tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return writer.format_shard_names(Path(path))[0]


def write_gguf(path: str | os.PathLike, arch: str, tensors: dict[str, np.ndarray], **metadata: Any) -> Path:
    """A GGUF of `tensors` (each written in its own dtype) and string/uint32 `metadata` keys under
    general.architecture `arch`: control vectors (`controlvector`), broken files for error tests."""
    w = gguf.GGUFWriter(str(path), arch)
    for key, value in metadata.items():
        w.add_uint32(key, value) if isinstance(value, int) else w.add_string(key, value)
    return finish_gguf(w, tensors, path)


def finish_gguf(w: gguf.GGUFWriter, tensors: dict[str, np.ndarray], path: str | os.PathLike) -> Path:
    """Add `tensors` to a writer holding its metadata already and write the file out; -> path."""
    for name, value in tensors.items():
        w.add_tensor(name, value)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return Path(path)
