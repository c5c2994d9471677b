"""GGUF metadata of a BERT encoder (`general.architecture` "bert" or "nomic-bert") -> a validated `BertSpec`.

The keys and defaults are llama.cpp's (src/models/bert.cpp, src/llama-model.cpp): sizes from
`bert.block_count`, `embedding_length`, `feed_forward_length`, `attention.head_count`,
`context_length` (the position-embedding rows), `attention.layer_norm_epsilon`; the pooling the
model was trained with from `bert.pooling_type` (absent: none, as llama.cpp); the classifier's
outputs from `bert.classifier.output_labels` (absent: 1). Which optional tensors the file holds
(token types, the `cls` dense layer, the `cls.output` classifier) is read from its tensor list.

`nomic-bert` (nomic-embed-text; llama.cpp's LLM_ARCH_NOMIC_BERT, same graph in src/models/bert.cpp)
differs in three switches: no position embeddings but NEOX rotary q/k (`nomic-bert.rope.freq_base`),
a SiLU-gated FFN (ffn_gate, ffn_up, ffn_down; llama.cpp passes no FFN biases), and q|k|v in one
`attn_qkv` tensor (separate ones are read too). Its keys are under `nomic-bert.`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from slotserver.model.gguf_file import GGUFError, GGUFFile

ARCHES = ("bert", "nomic-bert")
POOLING_IDS = {0: "none", 1: "mean", 2: "cls", 3: "last", 4: "rank"}   # llama.cpp's enum llama_pooling_type
LIMIT = 1 << 24   # no real dimension is this large; guards against absurd allocations


@dataclass(frozen=True)
class BertSpec:
    n_layers: int
    d_model: int
    n_heads: int
    d_ff: int
    vocab_size: int
    ctx_train: int              # position-embedding rows: the longest input
    norm_eps: float
    pooling: str                # the model's own pooling (POOLING_IDS' names)
    n_cls_out: int = 1          # classifier outputs (rerank reads the first)
    has_token_types: bool = True
    has_cls: bool = False       # `cls.weight`: a dense + tanh layer before the classifier
    has_cls_out: bool = False   # `cls.output.weight`: the classifier
    arch: str = "bert"
    rope_base: float = 0.0      # > 0: NEOX rotary q/k with this base, no position embeddings (nomic-bert)
    gated: bool = False         # a SiLU-gated FFN without biases (nomic-bert), not GELU(x Wup + b)

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @property
    def can_rank(self) -> bool:
        """Rank pooling needs a classification head (llama.cpp: `cls` and/or `cls.output`)."""
        return self.has_cls or self.has_cls_out

    @classmethod
    def from_gguf(cls, f: GGUFFile) -> "BertSpec":
        md = f.metadata
        arch = md.get("general.architecture")
        if arch not in ARCHES:
            raise GGUFError(f.path, f"architecture {arch!r} is not a bert encoder ({', '.join(ARCHES)})")
        pooling_id = md.get(f"{arch}.pooling_type", 0)
        if pooling_id not in POOLING_IDS:
            raise GGUFError(f.path, f"metadata {arch}.pooling_type = {pooling_id!r} is not a pooling type (0-4)")
        labels = md.get(f"{arch}.classifier.output_labels")
        nomic = arch == "nomic-bert"
        spec = cls(
            n_layers=_int(f, arch, "block_count"), d_model=_int(f, arch, "embedding_length"),
            n_heads=_int(f, arch, "attention.head_count"), d_ff=_int(f, arch, "feed_forward_length"),
            vocab_size=_int(f, arch, "vocab_size", len(md.get("tokenizer.ggml.tokens", ())) or None),
            ctx_train=_int(f, arch, "context_length"), norm_eps=_float(f, arch, "attention.layer_norm_epsilon"),
            pooling=POOLING_IDS[pooling_id], n_cls_out=len(labels) if isinstance(labels, list) and labels else 1,
            has_token_types="token_types.weight" in f.tensors, has_cls="cls.weight" in f.tensors,
            has_cls_out="cls.output.weight" in f.tensors, arch=arch,
            rope_base=_float(f, arch, "rope.freq_base", 10000.0) if nomic else 0.0, gated=nomic,
        )
        spec._validate(f)
        return spec

    def _validate(self, f: GGUFFile) -> None:
        problems = []
        if self.d_model % self.n_heads:
            problems.append(f"embedding_length {self.d_model} is not a multiple of head_count {self.n_heads}")
        if not 0 < self.norm_eps < 1:
            problems.append(f"layer norm epsilon {self.norm_eps} out of range")
        if self.rope_base and (self.head_dim % 2 or self.rope_base <= 0):
            problems.append(f"rotary heads need an even head size and a positive base "
                            f"({self.head_dim}, {self.rope_base})")
        if f.metadata.get(f"{self.arch}.attention.causal", False):
            problems.append("attention.causal is set (a causal bert is not supported)")
        if problems:
            raise GGUFError(f.path, f"bad {self.arch} metadata: {'; '.join(problems)}")


def _int(f: GGUFFile, arch: str, name: str, default=None) -> int:
    value = f.metadata.get(f"{arch}.{name}", default)
    if value is None:
        raise GGUFError(f.path, f"missing metadata key {arch}.{name}")
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= LIMIT:
        raise GGUFError(f.path, f"metadata {arch}.{name} = {value!r} is not a sane positive integer")
    return value


def _float(f: GGUFFile, arch: str, name: str, default=None) -> float:
    value = f.metadata.get(f"{arch}.{name}", default)
    if value is None:
        raise GGUFError(f.path, f"missing metadata key {arch}.{name}")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise GGUFError(f.path, f"metadata {arch}.{name} = {value!r} is not a number")
    return float(value)
