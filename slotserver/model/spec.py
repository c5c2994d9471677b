"""GGUF metadata -> a validated `ModelSpec`, driven by a table of architectures.

Adding a llama-family architecture is one `ArchDef` row: whether q/k/v carry biases and which rope
mode its GGUF weights expect. Everything else (GQA, tied embeddings, rope base/scaling) is read from
the metadata keys llama.cpp uses (`{arch}.block_count`, `{arch}.attention.head_count_kv`, ...).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from slotserver.model.gguf_file import GGUFError, GGUFFile


@dataclass(frozen=True)
class ArchDef:
    qkv_bias: bool = False
    rope_mode: str = "normal"  # "normal": adjacent pairs (GGUF llama); "neox": half split (qwen2)


ARCHS: dict[str, ArchDef] = {
    "llama": ArchDef(),
    "mistral": ArchDef(),
    "qwen2": ArchDef(qkv_bias=True, rope_mode="neox"),
}


@dataclass(frozen=True)
class ModelSpec:
    arch: str
    n_layers: int
    d_model: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    d_ff: int
    vocab_size: int
    ctx_train: int
    norm_eps: float
    rope_base: float
    rope_dim: int
    rope_scale: float          # positions are multiplied by this (1 / linear scaling factor)
    tied_embeddings: bool
    qkv_bias: bool
    rope_mode: str
    has_rope_freqs: bool       # llama3-style per-frequency factors in `rope_freqs.weight`

    @property
    def group(self) -> int:
        return self.n_heads // self.n_kv_heads

    @classmethod
    def from_gguf(cls, f: GGUFFile) -> "ModelSpec":
        md = f.metadata
        arch = md.get("general.architecture")
        if arch not in ARCHS:
            raise GGUFError(f"{f.path}: unknown architecture {arch!r} (supported: {', '.join(ARCHS)})")
        key = _Keys(f, arch)
        n_heads = key.int("attention.head_count")
        d_model = key.int("embedding_length")
        head_dim = key.int("attention.key_length", d_model // n_heads)
        spec = cls(
            arch=arch,
            n_layers=key.int("block_count"),
            d_model=d_model,
            n_heads=n_heads,
            n_kv_heads=key.int("attention.head_count_kv", n_heads),
            head_dim=head_dim,
            d_ff=key.int("feed_forward_length"),
            vocab_size=key.int("vocab_size", len(md.get("tokenizer.ggml.tokens", ())) or None),
            ctx_train=key.int("context_length"),
            norm_eps=key.float("attention.layer_norm_rms_epsilon", 1e-5),
            rope_base=key.float("rope.freq_base", 10000.0),
            rope_dim=key.int("rope.dimension_count", head_dim),
            rope_scale=_rope_scale(key),
            tied_embeddings="output.weight" not in f.tensors,
            qkv_bias=ARCHS[arch].qkv_bias,
            rope_mode=ARCHS[arch].rope_mode,
            has_rope_freqs="rope_freqs.weight" in f.tensors,
        )
        spec._validate(f)
        return spec

    def _validate(self, f: GGUFFile) -> None:
        problems = []
        if self.n_heads % self.n_kv_heads:
            problems.append(f"head_count {self.n_heads} is not a multiple of head_count_kv {self.n_kv_heads}")
        if self.rope_dim % 2 or self.rope_dim > self.head_dim:
            problems.append(f"rope dimension {self.rope_dim} must be even and <= head dim {self.head_dim}")
        if not (0 < self.norm_eps < 1):
            problems.append(f"rms epsilon {self.norm_eps} out of range")
        if not (self.rope_base > 0 and math.isfinite(self.rope_base)):
            problems.append(f"rope base {self.rope_base} must be positive")
        if problems:
            raise GGUFError(f"{f.path}: bad model metadata: {'; '.join(problems)}")


class _Keys:
    """Typed access to `{arch}.*` metadata with range checks and one-line errors."""

    LIMIT = 1 << 24  # no real dimension is this large; guards against absurd allocations

    def __init__(self, f: GGUFFile, arch: str) -> None:
        self.f, self.arch = f, arch

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


def _rope_scale(key: _Keys) -> float:
    kind = key.f.metadata.get(f"{key.arch}.rope.scaling.type", "none")
    if kind in ("none", None):
        return 1.0
    if kind == "linear":
        return 1.0 / key.float("rope.scaling.factor")
    raise GGUFError(f"{key.f.path}: rope scaling type {kind!r} is not supported (none, linear)")
