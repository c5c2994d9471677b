"""Reading a `ModelSpec`'s values from GGUF metadata: typed `{arch}.*` keys with range checks and
one-line errors (`MetaKeys`), and the readers whose answer depends on the architecture's row
(archs.py) as well as the keys: sliding windows, FFN lengths per layer, KV heads per layer,
attention biases, unrotated layers, the attention and embedding scales. llama.cpp's defaults
(src/llama-model.cpp, src/models/<arch>.cpp) where a key is absent.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from slotserver.model.archs import ArchDef
from slotserver.model.gguf_file import GGUFError, GGUFFile
from slotserver.model.rope_scaling import RopeScaling


class MetaKeys:
    """Typed access to `{arch}.*` metadata with range checks and one-line errors."""

    LIMIT = 1 << 24  # no real dimension is this large; guards against absurd allocations

    def __init__(self, f: GGUFFile, arch: str) -> None:
        self.f, self.arch = f, arch

    def has(self, name: str) -> bool:
        return f"{self.arch}.{name}" in self.f.metadata

    def raw(self, name: str, default=None):
        return self.f.metadata.get(f"{self.arch}.{name}", default)

    def _get(self, name: str, default):
        value = self.f.metadata.get(f"{self.arch}.{name}", default)
        if value is None:
            raise GGUFError(f"{self.f.path}: missing metadata key {self.arch}.{name}")
        return value

    def int(self, name: str, default=None) -> int:
        value = self._get(name, default)
        if isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= self.LIMIT:
            raise GGUFError(f"{self.f.path}: metadata {self.arch}.{name} = {value!r} is not a sane positive integer")
        return value

    def float(self, name: str, default=None) -> float:
        value = self._get(name, default)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise GGUFError(f"{self.f.path}: metadata {self.arch}.{name} = {value!r} is not a number")
        return float(value)

    def error(self, what: str) -> GGUFError:
        return GGUFError(f"{self.f.path}: {what}")


def sliding_windows(a: ArchDef, key: MetaKeys, n_layers: int,
                    rope: RopeScaling) -> tuple[tuple[int, ...], float, float]:
    """Per-layer windows and the windowed layers' rope (base, scale), as llama.cpp's gemma2/gemma3;
    lfm2 windows every attention layer when the file names a window, rotated as the others."""
    n_swa = key.raw("attention.sliding_window", a.swa_default)
    if isinstance(n_swa, bool) or not isinstance(n_swa, int) or n_swa < 0:
        raise key.error(f"metadata {key.arch}.attention.sliding_window = {n_swa!r} is not a window size")
    if a.swa_all:   # every layer's window (the recurrent layers' unread), at the global rope
        return (tuple([n_swa] * n_layers) if n_swa else ()), rope.base, rope.freq_scale
    if not a.swa_pattern or (a.swa_n_layers and n_layers != a.swa_n_layers):
        return (), rope.base, rope.freq_scale
    if n_swa == 0:
        return (), rope.base, rope.freq_scale
    pattern = key.raw("attention.sliding_window_pattern", a.swa_pattern)
    if isinstance(pattern, list):   # an explicit per-layer flag array
        if len(pattern) != n_layers:
            raise key.error(f"attention.sliding_window_pattern has {len(pattern)} entries for {n_layers} layers")
        flags = [bool(p) for p in pattern]
    else:
        flags = [pattern == 0 or i % pattern < pattern - 1 for i in range(n_layers)]
    windows = tuple(n_swa if w else 0 for w in flags)
    if a.swa_rope_plain:   # olmo2.cpp rotates windowed layers with the global base: freq_base_swa is not read
        return windows, rope.base, 1.0
    if not a.swa_rope_file:   # exaone4.cpp rotates every layer with the global rope: freq_base_swa is not read
        return windows, rope.base, rope.freq_scale
    base_default, scale = (rope.base, rope.freq_scale) if a.swa_rope_global else (10000.0, 1.0)
    return windows, key.float("rope.freq_base_swa", base_default), scale


def ffn_lengths(a: ArchDef, key: MetaKeys, n_layers: int) -> tuple[int, tuple[bool, ...]]:
    """(d_ff, ffn_only): `feed_forward_length`, or for one-block layers (nemotron_h) an array of it,
    nonzero (and alike) on the FFN-only layers. A MoE file may leave it out (qwen35moe: expert and
    shared-expert sizes only), as llama.cpp allows."""
    if not a.single_blocks:
        return (key.int("feed_forward_length") if key.has("feed_forward_length") or not key.raw("expert_count")
                else 0), ()
    ff = key.raw("feed_forward_length")   # (with an MTP block's entry past n_layers: not run)
    ff = ff[:n_layers] if isinstance(ff, list) and len(ff) >= n_layers else None
    sizes = {n for n in ff if n} if ff is not None else set()
    if len(sizes) != 1 or not all(isinstance(n, int) and not isinstance(n, bool) and 0 < n < key.LIMIT for n in sizes):
        raise key.error(f"feed_forward_length {ff!r} must give each of the {n_layers} layers its FFN size "
                        "(0 for a mixer), the FFN layers all alike")
    return sizes.pop(), tuple(bool(n) for n in ff)


def attn_bias(f: GGUFFile, a: ArchDef) -> bool:
    """Whether the file's attention layers have q/k/v biases (llama.cpp's create_tensor_qkv loads them
    where present): layer 0's, or for a hybrid any layer's (its layer 0 may be recurrent)."""
    if not a.hybrid:
        return "blk.0.attn_q.bias" in f.tensors
    return any(n.startswith("blk.") and n.endswith(".attn_q.bias") for n in f.tensors)


def kv_heads(key: MetaKeys, n_heads: int, per_layer: bool) -> int:
    """`attention.head_count_kv`: one number, or (LFM2, `per_layer`) one a layer with 0 for its
    recurrent layers, the attention layers all alike."""
    kv = key.raw("attention.head_count_kv", n_heads)
    if not per_layer or not isinstance(kv, list):
        return key.int("attention.head_count_kv", n_heads)
    heads = {h for h in kv if h}
    if len(heads) != 1 or not all(isinstance(h, int) and not isinstance(h, bool) and 0 < h <= n_heads for h in heads):
        raise key.error(f"attention.head_count_kv {kv} must give every attention layer the same KV head count")
    return heads.pop()


def no_rope_step(a: ArchDef, key: MetaKeys) -> int:
    """smollm3's every 4th layer unrotated; 1 (no layer rotated) for the granites where
    `rope.scaling.finetuned` is false (llama.cpp's switch for them; default true)."""
    if a.rope_switch and key.raw("rope.scaling.finetuned", True) is False:
        return 1
    return a.no_rope_step


def attn_scale(a: ArchDef, key: MetaKeys, n_layers: int, d_model: int, n_heads: int, head_dim: int) -> float:
    if a.multipliers and not a.minicpm_scales:   # minicpm's loader reads no attention.scale
        return key.float("attention.scale", 0.0)
    if a.gemma_scale and n_layers in ({"gemma2": 46, "gemma3": 62}.get(key.arch, -1),):  # the 27B models
        return 1.0 / math.sqrt(d_model // n_heads)
    return 0.0


def embed_scale(a: ArchDef, key: MetaKeys, d_model: int, n_layers: int) -> float:
    if a.embed_scale == "sqrt_d":
        return math.sqrt(d_model)
    if a.embed_scale == "metadata":
        return key.float("embedding_scale", _minicpm_defaults(d_model, n_layers)[0] if a.minicpm_scales else 0.0) or 1.0
    return 1.0


def residual_scale(a: ArchDef, key: MetaKeys, n_layers: int) -> float:
    """granite's residual multiplier (0 or missing: none, as llama.cpp's `if (f_residual_scale)`)."""
    if not a.multipliers:
        return 1.0
    return key.float("residual_scale", _minicpm_defaults(1, n_layers)[1] if a.minicpm_scales else 1.0) or 1.0


def logit_scale(a: ArchDef, key: MetaKeys, d_model: int) -> float:
    """granite's logit divisor: a required key, except minicpm's (256 / d_model when missing)."""
    if not a.multipliers:
        return 1.0
    return key.float("logit_scale", _minicpm_defaults(d_model, 1)[2]) if a.minicpm_scales else key.float("logit_scale")


def _minicpm_defaults(d_model: int, n_layers: int) -> tuple[float, float, float]:
    """llama_model_minicpm::load_arch_hparams' defaults (embedding, residual, logit), in float32 as there."""
    f32 = np.float32
    return 12.0, float(f32(1.4) / np.sqrt(f32(n_layers))), float(f32(256.0) / f32(d_model))


def text_still_pairs(key: MetaKeys, rope_dim: int, interleaved: bool) -> tuple[int, ...]:
    """M-RoPE (ggml's MROPE: Qwen2-VL, Qwen2.5-VL) and its interleaved form (IMROPE: Qwen3-VL,
    Qwen3.5) rotate each pair by one of 4 positions, chosen by `rope.dimension_sections`. For text
    the first 3 (t, h, w) are the token's position and the 4th ("e") is 0, as llama.cpp sets them:
    so text is neox rope, except that a pair in no t, h or w section is not rotated (angle 0).
    -> those pairs (none for Qwen2-VL's [16, 24, 24, 0] over 64 pairs or Qwen3.5's [11, 11, 10, 0]
    over 32; pairs 61 and 62 of Qwen3-VL's interleaved [24, 20, 20, 0]). Images are not served
    (multimodal input is refused)."""
    sections = key.raw("rope.dimension_sections")
    if not isinstance(sections, list) or len(sections) < 3 or not all(isinstance(s, int) and s >= 0 for s in sections):
        raise key.error(f"rope.dimension_sections = {sections!r} is not a list of section sizes")
    t, h, w = sections[:3]
    total, still = sum(sections[:4]), []
    for pair in range(rope_dim // 2):
        sector = pair % total if total else pair
        if interleaved:
            in_thw = (sector % 3 == 0 and sector < 3 * t) or (sector % 3 == 1 and sector < 3 * h) \
                or (sector % 3 == 2 and sector < 3 * w)
        else:
            in_thw = sector < t + h + w
        if not in_thw:
            still.append(pair)
    return tuple(still)


def alpha_base(a: ArchDef, key: MetaKeys, rope: RopeScaling, head_dim: int) -> RopeScaling:
    """Hunyuan's NTK-aware alpha (hunyuan-vl.cpp's loader): with `rope.scaling.alpha` > 0 the trained
    base is base * alpha^(head_dim / (head_dim - 2)), in float32 as there; else the rope as it is."""
    alpha = key.float("rope.scaling.alpha", 0.0) if a.rope_alpha else 0.0
    if alpha <= 0 or head_dim <= 2:
        return rope
    f32 = np.float32
    return replace(rope, base=float(f32(rope.base) * np.power(f32(alpha), f32(head_dim) / f32(head_dim - 2))))
