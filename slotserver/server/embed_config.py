"""Validated settings of an embedding server (`--embedding`, `--pooling`, `--reranking`), from serve's flags.

As llama-server: `--embedding` (alias `--embeddings`) makes the server embedding-only (it computes
no completions); `--reranking` (alias `--rerank`) is `--embedding` with rank pooling, which
/rerank needs; `--pooling` picks the pooling, else the model's own (`{arch}.pooling_type`).
A request's input may hold at most `min(--ubatch-size, --ctx-size / --parallel, the model's
context)` tokens, llama-server's limits for an encoder (all of a sequence in one micro-batch).
`--embd-normalize N` is every request's `embd_normalize` unless it sets its own (llama-server's).
`--pooling` or `--embd-normalize` without `--embedding` or `--reranking` is refused rather than ignored.
"""

from __future__ import annotations

from dataclasses import dataclass

from slotserver.errors import ConfigError

POOLINGS = ("none", "mean", "cls", "last", "rank")   # slotserver.model.encoder.pooling.POOLINGS (no torch here)
DEFAULT_NORMALIZE = 2                                # llama-server's embd_normalize: euclidean


@dataclass(frozen=True)
class EmbeddingConfig:
    pooling: str | None = None      # None: the model's own pooling type
    rerank: bool = False            # /rerank served (rank pooling)
    ubatch: int = 512               # -ub: the longest input in tokens
    ctx_slot: int = 4096            # --ctx-size / --parallel: also a bound on an input
    normalize: int = DEFAULT_NORMALIZE
    max_batch_tokens: int = 8192    # padded tokens per forward (many inputs are batched together)

    def __post_init__(self) -> None:
        if self.pooling is not None and self.pooling not in POOLINGS:
            raise ConfigError(f"--pooling must be one of {', '.join(POOLINGS)}, got {self.pooling!r}")
        if self.rerank and self.pooling not in (None, "rank"):
            raise ConfigError(f"--reranking uses rank pooling; it cannot be combined with --pooling {self.pooling}")
        for name in ("ubatch", "ctx_slot", "max_batch_tokens"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1 for an embedding server, got {getattr(self, name)}")
        if self.normalize < -1:
            raise ConfigError(f"--embd-normalize must be >= -1, got {self.normalize}")

    @property
    def rank(self) -> bool:
        return self.rerank or self.pooling == "rank"

    def max_tokens(self, ctx_train: int) -> int:
        """The longest input served for a model trained on `ctx_train` positions."""
        return min(self.ubatch, self.ctx_slot, ctx_train)


def embedding_config_from_args(args) -> EmbeddingConfig | None:
    """serve's parsed flags -> an EmbeddingConfig, or None for a generation server."""
    embedding, rerank = getattr(args, "embedding", False), getattr(args, "reranking", False)
    pooling, normalize = getattr(args, "pooling", None), getattr(args, "embd_normalize", None)
    if not (embedding or rerank):
        for flag, value in (("--pooling", pooling), ("--embd-normalize", normalize)):
            if value is not None:
                raise ConfigError(f"{flag} {value} applies to an embedding server: add --embedding (or --reranking)")
        return None
    parallel = max(1, args.parallel)
    if pooling is None and rerank:
        pooling = "rank"
    return EmbeddingConfig(pooling=pooling, rerank=rerank or pooling == "rank",
                           ubatch=args.ubatch_size, ctx_slot=max(1, args.ctx_size // parallel),
                           normalize=DEFAULT_NORMALIZE if normalize is None else normalize)
