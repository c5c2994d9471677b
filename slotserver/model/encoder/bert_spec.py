"""GGUF metadata of a BERT encoder (`general.architecture == "bert"`) -> a validated `BertSpec`.

The keys and defaults are llama.cpp's (src/models/bert.cpp, src/llama-model.cpp): sizes from
`bert.block_count`, `embedding_length`, `feed_forward_length`, `attention.head_count`,
`context_length` (the position-embedding rows), `attention.layer_norm_epsilon`; the pooling the
model was trained with from `bert.pooling_type` (absent: none, as llama.cpp); the classifier's
outputs from `bert.classifier.output_labels` (absent: 1). Which optional tensors the file holds
(token types, the `cls` dense layer, the `cls.output` classifier) is read from its tensor list.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from slotserver.model.gguf_file import GGUFError, GGUFFile

ARCH = "bert"
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
        if md.get("general.architecture") != ARCH:
            raise GGUFError(f.path, f"architecture {md.get('general.architecture')!r} is not bert")
        pooling_id = md.get(f"{ARCH}.pooling_type", 0)
        if pooling_id not in POOLING_IDS:
            raise GGUFError(f.path, f"metadata {ARCH}.pooling_type = {pooling_id!r} is not a pooling type (0-4)")
        labels = md.get(f"{ARCH}.classifier.output_labels")
        spec = cls(
            n_layers=_int(f, "block_count"), d_model=_int(f, "embedding_length"),
            n_heads=_int(f, "attention.head_count"), d_ff=_int(f, "feed_forward_length"),
            vocab_size=_int(f, "vocab_size", len(md.get("tokenizer.ggml.tokens", ())) or None),
            ctx_train=_int(f, "context_length"), norm_eps=_float(f, "attention.layer_norm_epsilon"),
            pooling=POOLING_IDS[pooling_id], n_cls_out=len(labels) if isinstance(labels, list) and labels else 1,
            has_token_types="token_types.weight" in f.tensors, has_cls="cls.weight" in f.tensors,
            has_cls_out="cls.output.weight" in f.tensors,
        )
        spec._validate(f)
        return spec

    def _validate(self, f: GGUFFile) -> None:
        problems = []
        if self.d_model % self.n_heads:
            problems.append(f"embedding_length {self.d_model} is not a multiple of head_count {self.n_heads}")
        if not 0 < self.norm_eps < 1:
            problems.append(f"layer norm epsilon {self.norm_eps} out of range")
        if f.metadata.get(f"{ARCH}.attention.causal", False):
            problems.append("attention.causal is set (a causal bert is not supported)")
        if problems:
            raise GGUFError(f.path, f"bad bert metadata: {'; '.join(problems)}")


def _int(f: GGUFFile, name: str, default=None) -> int:
    value = f.metadata.get(f"{ARCH}.{name}", default)
    if value is None:
        raise GGUFError(f.path, f"missing metadata key {ARCH}.{name}")
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= LIMIT:
        raise GGUFError(f.path, f"metadata {ARCH}.{name} = {value!r} is not a sane positive integer")
    return value


def _float(f: GGUFFile, name: str) -> float:
    value = f.metadata.get(f"{ARCH}.{name}")
    if value is None:
        raise GGUFError(f.path, f"missing metadata key {ARCH}.{name}")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise GGUFError(f.path, f"metadata {ARCH}.{name} = {value!r} is not a number")
    return float(value)
