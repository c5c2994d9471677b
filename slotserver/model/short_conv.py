"""LFM2's short-convolution layer over a ragged batch (llama.cpp's lfm2 `build_shortconv_block`).

Between the in-projection and the out-projection (model.py's plain matmuls):

    B, C, x = in_proj(h)            # d_model each
    y = C * conv(B * x)             # conv: causal, depthwise, `shortconv.l_cache` wide (3), no bias

the convolution reading each sequence's last l_cache - 1 inputs (B * x) from its stream's state
(runtime/recurrent_state.py, the `conv` part; this layer has no matrix state). A decode step's rows
(a mixed step's leading decodes) are one call of the kernel set's `short_conv_step`
(kernels/short_conv_step.py); prompt rows run here in float32 torch (model/delta_net.py's `conv_rows`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from slotserver.model.delta_net import conv_rows
from slotserver.runtime.batch import Batch
from slotserver.runtime.recurrent_state import RecurrentState, leading_decodes


@dataclass
class ShortConvParams:
    conv: torch.Tensor   # [d_model, l_cache] float32: the convolution's taps

    def run(self, spec, proj: torch.Tensor, batch: Batch, state: RecurrentState, layer: int, ops) -> torch.Tensor:
        """proj [T, 3 d_model] -> [T, d_model] in proj's dtype (before the out-projection)."""
        row, head = state.row[layer], leading_decodes(batch.attn)
        nb = 0 if head is None else head.n_seqs
        decoded = ops.short_conv_step(proj[:nb], state.conv[row], head.seq_streams, self.conv)[0] if nb else None
        if nb == proj.shape[0]:
            return decoded
        b, c, x = proj[nb:].float().chunk(3, dim=1)
        rest = (c * conv_rows(state, row, state.seqs[nb:], nb, b * x, self.conv)).to(proj.dtype)
        return rest if decoded is None else torch.cat([decoded, rest])
