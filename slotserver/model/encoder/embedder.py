"""`Embedder`: a GGUF file loaded for embeddings and reranking: encoder, tokenizer, pooling.

`Embedder.load` reads a BERT encoder (encoder/bert.py, its WordPiece vocabulary) or, for any other
supported architecture, the llama-family model's final-normed hidden states (encoder/decoder.py).
`run(sequences)` computes pooled vectors for many token sequences in few forwards: sorted by
length, cut into batches of at most `max_batch_tokens` tokens counted as if padded to the batch's
longest (which bounds attention's `[B, H, L, L]` scores; the projections run on the packed tokens).

The pooling is the one asked for, else the model's (`{arch}.pooling_type`, none when absent), as
llama.cpp picks it. `rank` needs a classification head (BERT's `cls`/`cls.output`, or a decoder
reranker's `cls.output`: Qwen3-Reranker, its "yes"/"no" rows of the output projection); a model
without one is refused at load, in one line naming the file.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Protocol

import torch

from slotserver.errors import ConfigError
from slotserver.model.config import ModelConfig
from slotserver.model.encoder.bert_spec import POOLING_IDS
from slotserver.model.encoder.pooling import POOLINGS, RankHead, pool
from slotserver.model.gguf_file import GGUFFile
from slotserver.model.metadata_overrides import apply_overrides
from slotserver.model.text.tokenizer import Tokenizer
from slotserver.runtime import cpu_features

DEFAULT_BATCH_TOKENS = 8192
RERANK_TEMPLATE_KEY = "tokenizer.chat_template.rerank"   # llama_model_chat_template(model, "rerank")


class Encoder(Protocol):
    def forward(self, seqs: list[list[int]]) -> torch.Tensor:
        """Token sequences -> float32 hidden states `[sum of lengths, d]`, packed in order."""


@dataclass
class Embedder:
    encoder: Encoder
    tokenizer: Tokenizer
    pooling: str                      # one of POOLINGS
    ctx_train: int                    # the longest sequence the model takes
    dims: int                         # a pooled vector's size (a token's with pooling none)
    arch: str
    rank: RankHead | None = None      # rank pooling's head (pooling.py)
    rerank_template: str | None = None
    max_batch_tokens: int = DEFAULT_BATCH_TOKENS
    dense: tuple[torch.Tensor | None, torch.Tensor | None] = (None, None)   # dense_2, dense_3 after pooling

    @classmethod
    def load(cls, config: ModelConfig, pooling: str | None = None, gelu_table: bool = True) -> "Embedder":
        """The file of `config.model_path` for embeddings with `pooling` (None: the model's own).
        On the CPU: `--device auto` means the CPU here, an explicit other device is refused."""
        if config.device not in ("cpu", "auto"):
            raise ConfigError(f"--device {config.device}: embeddings and reranking run on the CPU only "
                              "(use --device cpu or auto)")
        config = replace(config, device="cpu")
        torch.set_num_threads(config.threads or cpu_features.physical_cores())
        f = GGUFFile.open(config.model_path)
        apply_overrides(f.path, f.metadata, config.kv_overrides)   # --override-kv
        arch = f.metadata.get("general.architecture")
        template = f.metadata.get(RERANK_TEMPLATE_KEY)
        template = template if isinstance(template, str) else None
        if arch in ("bert", "nomic-bert", "modern-bert") and config.rope_flags.any:
            raise ConfigError(f"--rope-*/--yarn-* ({config.rope_flags.shown()}) are not applied to a {arch} "
                              "encoder here: leave them out")
        if config.control_vectors:
            raise ConfigError("--control-vector does not apply to embeddings here: leave it out")
        if arch in ("bert", "nomic-bert"):   # --dtype bfloat16: bf16 projections; else f32 (llama.cpp's results)
            dtype = torch.bfloat16 if config.dtype == "bfloat16" else torch.float32
            return cls._bert(f, pooling, gelu_table, template, dtype)
        if arch == "modern-bert":
            return cls._modern_bert(f, pooling, template)
        return cls._decoder(config, f, pooling, template)

    @classmethod
    def _bert(cls, f: GGUFFile, pooling: str | None, gelu_table: bool, template: str | None,
              dtype: torch.dtype) -> "Embedder":
        from slotserver.model.encoder.bert import BertModel
        from slotserver.model.encoder.bert_spec import BertSpec

        spec = BertSpec.from_gguf(f)
        tokenizer = Tokenizer.from_metadata(f.metadata)
        pooling = _checked_pooling(f, pooling or spec.pooling, spec.can_rank)
        model = BertModel.from_file(f, spec, gelu_table, dtype)
        dims = spec.n_cls_out if pooling == "rank" else spec.d_model
        rank = RankHead(model.weights.cls, model.weights.cls_out, _rank_rows(f, "first"))
        return cls(model, tokenizer, pooling, spec.ctx_train, dims, spec.arch, rank, template)

    @classmethod
    def _modern_bert(cls, f: GGUFFile, pooling: str | None, template: str | None) -> "Embedder":
        from slotserver.model.encoder.modern_bert import ModernBertModel, ModernBertSpec

        spec = ModernBertSpec.from_gguf(f)
        rank = _modern_bert_head(f, spec.norm_eps) if "cls.output.weight" in f.tensors else None
        pooling = _checked_pooling(f, pooling or spec.pooling, can_rank=rank is not None)
        dims = rank.cls_out[0].shape[0] if pooling == "rank" else spec.d_model   # type: ignore[union-attr,index]
        return cls(ModernBertModel(f, spec), Tokenizer.from_metadata(f.metadata), pooling, spec.ctx_train,
                   dims, "modern-bert", rank, template)

    @classmethod
    def _decoder(cls, config: ModelConfig, f: GGUFFile, pooling: str | None, template: str | None) -> "Embedder":
        from slotserver.model.bundle import ModelBundle
        from slotserver.model.encoder.bidirectional import BidirectionalEncoder
        from slotserver.model.encoder.decoder import DecoderEncoder

        arch = f.metadata.get("general.architecture")
        own = POOLING_IDS.get(f.metadata.get(f"{arch}.pooling_type", 0), "none")
        head = _decoder_head(f) if "cls.output.weight" in f.tensors else None
        pooling = _checked_pooling(f, pooling or own, can_rank=head is not None)
        bundle = ModelBundle.load(config, embedding=True)
        spec = bundle.model.spec
        enc = BidirectionalEncoder(bundle.model) if spec.bidirectional else \
            DecoderEncoder(bundle.model, config.layouts_dir)
        dense = tuple(f.load_tensor(n) if n in f.tensors else None for n in ("dense_2.weight", "dense_3.weight"))
        dims = head[0].shape[0] if pooling == "rank" else next(  # type: ignore[index]
            (d.shape[0] for d in reversed(dense) if d is not None), enc.d_model)
        rank = RankHead(cls_out=head, rows=_rank_rows(f, "first" if spec.bidirectional else "last"),
                        softmax=arch in ("qwen3", "qwen3vl"))
        return cls(enc, bundle.tokenizer, pooling, enc.ctx_train, dims, spec.arch, rank, template, dense=dense)

    def run(self, seqs: list[list[int]]) -> list[torch.Tensor]:
        """Pooled float32 vectors, one tensor per sequence (`[1, dims]`, or `[len, dims]` with pooling
        none), in the order given. Every sequence must hold 1..ctx_train tokens in the vocabulary."""
        out: list[torch.Tensor | None] = [None] * len(seqs)
        for batch in self._batches(seqs):
            hidden = self.encoder.forward([seqs[i] for i in batch])                  # [T, d] packed
            lengths = [len(seqs[i]) for i in batch]
            pooled = pool(self.pooling, hidden, lengths, self.rank)
            for i, vec in zip(batch, pooled):
                out[i] = self._dense(vec)
        return out  # type: ignore[return-value]

    def _dense(self, vec: torch.Tensor) -> torch.Tensor:
        """The file's dense projections after pooling (EmbeddingGemma's 768 -> 3072 -> 768), as
        llama.cpp's build_dense_out: rows [n, d] -> [n, dims]."""
        for weight in self.dense:
            if weight is not None:
                vec = vec @ weight.T
        return vec

    def _batches(self, seqs: list[list[int]]) -> list[list[int]]:
        """Indices of `seqs` by length, cut where the padded batch would pass max_batch_tokens."""
        order = sorted(range(len(seqs)), key=lambda i: len(seqs[i]))
        batches: list[list[int]] = []
        for i in order:   # lengths grow along `order`, so the newest is the batch's longest
            if batches and (len(batches[-1]) + 1) * len(seqs[i]) <= self.max_batch_tokens:
                batches[-1].append(i)
            else:
                batches.append([i])
        return batches


def _checked_pooling(f: GGUFFile, pooling: str, can_rank: bool) -> str:
    if pooling not in POOLINGS:
        raise ConfigError(f"--pooling must be one of {', '.join(POOLINGS)}, got {pooling!r}")
    if pooling == "rank" and not can_rank:
        raise ConfigError(f"{f.path}: rank pooling (--reranking) needs a model with a classification "
                          "head (cls / cls.output tensors); this file has none")
    return pooling


def _rank_rows(f: GGUFFile, default: str, mean_default: bool = False) -> str:
    """The rows rank pooling reads: the mean where `{arch}.classifier.pooling_type` says mean (1), as
    llama.cpp checks first; else `default` (BERT's first token, a causal decoder's last)."""
    arch = f.metadata.get("general.architecture")
    kind = f.metadata.get(f"{arch}.classifier.pooling_type", 1 if mean_default else 0)
    return "mean" if kind == 1 else default


def _modern_bert_head(f: GGUFFile, eps: float) -> RankHead:
    """ModernBERT's head: cls (no bias), GELU, cls.norm, cls.output; on the mean unless the file says
    otherwise (llama.cpp's default for it)."""
    def opt(name):
        return f.load_tensor(name) if name in f.tensors else None
    cls = (f.load_tensor("cls.weight"), opt("cls.bias")) if "cls.weight" in f.tensors else None
    return RankHead(cls, (f.load_tensor("cls.output.weight"), opt("cls.output.bias")),
                    _rank_rows(f, "first", mean_default=True), act="gelu", norm=opt("cls.norm.weight"), eps=eps)


def _decoder_head(f: GGUFFile) -> tuple[torch.Tensor, torch.Tensor | None]:
    """A decoder reranker's `cls.output` (weight [labels, d_model], bias or None) in float32."""
    bias = f.load_tensor("cls.output.bias") if "cls.output.bias" in f.tensors else None
    return f.load_tensor("cls.output.weight"), bias
