"""From per-token hidden states to what a client gets: llama.cpp's pooling and llama-server's normalization.

Pooling (llama.cpp's `build_pooling`, enum llama_pooling_type):
- `none`: every token's vector (llama-server answers them unnormalized, one per token);
- `mean`: the average over the sequence's tokens ([CLS] and [SEP] included);
- `cls`: the first token's vector; `last`: the last token's (for BERT inputs, [SEP]);
- `rank` (`RankHead`): the first token's vector through the classification head: `cls` (dense +
  tanh) where the file has it, then `cls.output` (a linear layer to the labels); a reranker's score
  is output 0. A decoder reranker (causal attention: Qwen3-Reranker) takes its last token's vector
  instead, and qwen3's labels ("yes", "no") go through a softmax; a file whose
  `classifier.pooling_type` is mean (ModernBERT's default) takes the mean, and ModernBERT's `cls`
  is followed by GELU and its `cls.norm` LayerNorm; all as llama.cpp's build_pooling does.

Normalization (common_embd_normalize, llama-server's `embd_normalize`, default 2): -1 none, 0 max
absolute scaled to int16's range (32760), 1 taxicab, 2 euclidean, p > 2 the p-norm; a zero vector
stays zero. llama-server normalizes pooled vectors only (`none` vectors go out as computed), and
sums in double, as done here (float64).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from slotserver.model.encoder.bert import ggml_gelu

POOLINGS = ("none", "mean", "cls", "last", "rank")
DEFAULT_NORMALIZE = 2

Head = tuple[torch.Tensor, torch.Tensor | None]   # (weight [out, in], bias [out] or None)


@dataclass(frozen=True)
class RankHead:
    """llama.cpp's RANK pooling: which rows, then `cls` (dense, then tanh or GELU, then the `norm`
    LayerNorm where the file has one), `cls.output`, and a softmax over the labels (qwen3)."""
    cls: Head | None = None
    cls_out: Head | None = None
    rows: str = "first"                 # "first" ([CLS]), "last" (a causal decoder), "mean"
    act: str = "tanh"                   # after cls: "tanh", or "gelu" (ModernBERT; ggml's f16 table)
    norm: torch.Tensor | None = None    # cls.norm weight (LayerNorm without bias)
    eps: float = 1e-5
    softmax: bool = False

    def __call__(self, rows: torch.Tensor) -> torch.Tensor:
        """[B, d] -> [B, n_labels]."""
        if self.cls is None and self.cls_out is None:
            raise ValueError("rank pooling needs a classification head (cls or cls.output tensors)")
        if self.cls is not None:
            rows = F.linear(rows, self.cls[0], self.cls[1])
            rows = torch.tanh(rows) if self.act == "tanh" else ggml_gelu(rows)
            if self.norm is not None:
                rows = F.layer_norm(rows, (rows.shape[1],), self.norm, None, self.eps)
        if self.cls_out is not None:
            rows = F.linear(rows, self.cls_out[0], self.cls_out[1])
        return rows.softmax(-1) if self.softmax else rows


def pool(kind: str, hidden: torch.Tensor, lengths: list[int], rank: RankHead | None = None) -> list[torch.Tensor]:
    """hidden `[T, d]` float32 (the sequences' tokens packed in order), lengths (summing to T) -> one
    float32 tensor per sequence: `[length, d]` for `none`, `[1, d_out]` for the others (d_out: the
    labels for `rank`, else d)."""
    if kind not in POOLINGS:
        raise ValueError(f"pooling must be one of {', '.join(POOLINGS)}, got {kind!r}")
    if kind == "none":
        return list(hidden.split(lengths))
    rank = rank or RankHead()
    rows = _rows(rank.rows if kind == "rank" else {"cls": "first"}.get(kind, kind), hidden, lengths)   # [B, d]
    if kind == "rank":
        rows = rank(rows)
    return list(rows.unsqueeze(1).unbind(0))                                      # B x [1, d_out]


def _rows(which: str, hidden: torch.Tensor, lengths: list[int]) -> torch.Tensor:
    """Each sequence's "first", "last" or "mean" row: [B, d]."""
    n = torch.tensor(lengths)
    ends = n.cumsum(0)                                                            # [B]
    if which == "mean":
        seq = torch.repeat_interleave(torch.arange(len(lengths)), n)              # [T]: each row's sequence
        return hidden.new_zeros(len(lengths), hidden.shape[1]).index_add_(0, seq, hidden) / n[:, None]
    return hidden[ends - 1] if which == "last" else hidden[ends - n]


def normalize(vector: torch.Tensor, p: int = DEFAULT_NORMALIZE) -> list[float]:
    """One pooled vector `[d]` normalized as llama-server's `embd_normalize = p` (see module doc).
    In numpy: the server calls it on its event loop, which must not start torch's thread team."""
    x = vector.numpy().astype(np.float32)
    if p == -1:
        total = 1.0
    elif p == 0:
        total = float(np.abs(x).max()) / 32760.0 if x.size else 0.0
    elif p == 2:
        total = float(np.sqrt((x * x).astype(np.float64).sum()))   # squares in f32, summed in double, as ggml
    else:
        total = float((np.abs(x.astype(np.float64)) ** p).sum() ** (1.0 / p))
    scale = np.float32(1.0 / total if total > 0.0 else 0.0)
    return (x * scale).tolist()
