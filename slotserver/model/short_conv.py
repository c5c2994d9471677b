"""LFM2's short-convolution layer over a ragged batch (llama.cpp's lfm2 `build_shortconv_block`).

Between the in-projection and the out-projection (model.py's plain matmuls):

    B, C, x = in_proj(h)            # d_model each
    y = C * conv(B * x)             # conv: causal, depthwise, `shortconv.l_cache` wide (3), no bias

the convolution reading each sequence's last l_cache - 1 inputs (B * x) from its stream's state
(runtime/recurrent_state.py, the `conv` part; this layer has no matrix state). Float32 torch, batched
over the sequences of a decode step on contiguous streams (model/delta_net.py's `conv_rows`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from slotserver.model.delta_net import conv_rows
from slotserver.runtime.batch import Batch
from slotserver.runtime.recurrent_state import RecurrentState


@dataclass
class ShortConvParams:
    conv: torch.Tensor   # [d_model, l_cache] float32: the convolution's taps

    def run(self, spec, proj: torch.Tensor, batch: Batch, state: RecurrentState, layer: int) -> torch.Tensor:
        """proj [T, 3 d_model] -> [T, d_model] float32 (before the out-projection)."""
        b, c, x = proj.float().chunk(3, dim=1)
        return c * conv_rows(state, state.row[layer], batch.attn, b * x, self.conv)
