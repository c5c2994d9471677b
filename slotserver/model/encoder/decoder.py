"""Hidden states of a decoder model (the llama-family `LlamaModel`) for embeddings, as llama.cpp's.

With `--embedding` llama.cpp pools a decoder's `result_norm`: the last layer's output after the
final RMSNorm, before the output projection, computed with the model's own causal attention. That
is `LlamaModel.forward` with the output matmul taken out, so this module runs a copy of the loaded
model whose output projection is the identity (and no logit scale or soft-cap), every row kept
(`all_logits`), on a KV cache made for the one batch and dropped after it.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from slotserver.model.config import DEFAULT_LAYOUT
from slotserver.model.model import LlamaModel
from slotserver.runtime.batch import Batch, SeqChunk
from slotserver.runtime.kv_spec import KVSpec
from slotserver.runtime.layouts import create_layout, load_layout


class _Identity:
    """Stands in for the output projection: `(x, ops) -> x`, so the forward returns result_norm."""

    def nbytes(self) -> int:   # what the step-graph budget counts of a weight
        return 0

    def __call__(self, x: torch.Tensor, ops=None) -> torch.Tensor:
        return x


class DecoderEncoder:
    """`forward(seqs)` over a llama-family model: final-normed hidden states `[T, d]`."""

    def __init__(self, model: LlamaModel, layouts_dir=None) -> None:
        spec = replace(model.spec, logit_scale=1.0, final_softcap=0.0)
        self.model = replace(model, spec=spec, weights=replace(model.weights, output=_Identity()))
        self.model.set_step_graphs(False)   # one-shot prefills: nothing to replay
        self.layout = load_layout(DEFAULT_LAYOUT, layouts_dir)
        self.ctx_train = model.spec.ctx_train
        self.d_model = model.spec.d_model

    @torch.inference_mode()
    def forward(self, seqs: list[list[int]]) -> torch.Tensor:
        """Token sequences -> float32 `[sum of lengths, d_model]`, each token's row, packed in order."""
        s, m = self.model.spec, self.model
        cells = max(map(len, seqs))
        cache = create_layout(self.layout, KVSpec(s.n_kv_layers, len(seqs), cells, s.n_kv_heads, s.head_dim, m.dtype))
        chunks = [SeqChunk(i, 0, list(seq), all_logits=True, prompt=True) for i, seq in enumerate(seqs)]
        return m.forward(Batch.build(chunks), cache).float()
