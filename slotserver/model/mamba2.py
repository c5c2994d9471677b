"""One Mamba-2 layer over a ragged batch (Granite 4.0-H's, llama.cpp's build_mamba2_layer).

Between the in-projection (model.py's plain matmul: z | x B C | dt a row) and the out-projection:

1. x B C go through a causal depthwise convolution of width d_conv (with a bias) over the sequence,
   whose first inputs are the last d_conv - 1 of the previous step (the conv state), then SiLU;
2. per head h (its group g: heads of a group adjacent), with dt = softplus(dt_h + dt_bias) and the
   decay e = exp(dt a) (a = -exp(A_log) < 0), the state S [N, head size] moves and is read along C:

       S = e S + B_g (dt x_h)^T;   y_h = S^T C_g + d_h x_h

3. y times silu(z), RMS-normed over each group's channels (`norm`; Falcon-H1's files mostly have
   no ssm_norm: no norm, as llama.cpp); the out-projection follows.

Steps 1-3 are one call of the kernel set's `mamba2_step` (kernels/mamba2_step.py: C on the CPU,
Triton on CUDA) over every row of the step, each sequence's tokens in order, as the delta net's
(model/delta_net.py). The states live in runtime/recurrent_state.py, one row per KV stream.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from slotserver.runtime.batch import Batch
from slotserver.runtime.recurrent_state import RecurrentState


@dataclass
class Mamba2Params:
    """A Mamba-2 layer's weights besides its two matmuls (model/recurrent_layer.py)."""

    conv: torch.Tensor       # [conv_dim, d_conv] float32: the convolution's taps
    conv_bias: torch.Tensor  # [conv_dim] float32 (zeros where the file has none)
    dt_bias: torch.Tensor    # [heads] float32
    a: torch.Tensor          # [heads] float32: -exp(A_log)
    d: torch.Tensor          # [heads] float32: the skip's scale
    norm: torch.Tensor | None  # [inner] float32: the group RMSNorm's weight, group after group (falcon-h1: None)

    def run(self, spec, proj: torch.Tensor, batch: Batch, state: RecurrentState, layer: int, ops) -> torch.Tensor:
        """proj: [T, proj_dim] -> [T, inner] in proj's dtype (before the out-projection); the
        streams' states updated."""
        r, meta, row = spec.recurrent, batch.attn, state.row[layer]
        return ops.mamba2_step(proj, state.conv[row], state.ssm[row], meta.seq_streams, meta.q_offsets, meta.q_lens,
                               self.conv, self.conv_bias, self.dt_bias, self.a, self.d, self.norm, r.n_k_heads,
                               spec.norm_eps)[0]
