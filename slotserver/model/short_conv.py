"""LFM2's short-convolution layer over a ragged batch (llama.cpp's lfm2 `build_shortconv_block`).

Between the in-projection and the out-projection (model.py's plain matmuls):

    B, C, x = in_proj(h)            # d_model each
    y = C * conv(B * x)             # conv: causal, depthwise, `shortconv.l_cache` wide (3), no bias

the convolution reading each sequence's last l_cache - 1 inputs (B * x) from its stream's state
(runtime/recurrent_state.py, the `conv` part; this layer has no matrix state): one call of the
kernel set's `short_conv_step` (kernels/short_conv_step.py) over every row of the step, each
sequence's tokens in order.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from slotserver.runtime.batch import Batch
from slotserver.runtime.recurrent_state import RecurrentState


@dataclass
class ShortConvParams:
    conv: torch.Tensor   # [d_model, l_cache] float32: the convolution's taps

    def run(self, spec, proj: torch.Tensor, batch: Batch, state: RecurrentState, layer: int, ops) -> torch.Tensor:
        """proj [T, 3 d_model] -> [T, d_model] in proj's dtype (before the out-projection)."""
        meta = batch.attn
        return ops.short_conv_step(proj, state.conv[state.row[layer]], meta.seq_streams, meta.q_offsets, meta.q_lens,
                                   self.conv)[0]
