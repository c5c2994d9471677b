"""One gated delta-net layer over a ragged batch (Qwen3.5's linear attention).

What llama.cpp's qwen35 graph computes (src/models/qwen35.cpp, delta-net-base.cpp), per sequence:

1. the in-projection (model.py, a plain matmul) gives per token q|k|v (`mixed`), z, beta, alpha;
2. `mixed` goes through a causal depthwise convolution of width d_conv over the sequence, whose
   first inputs are the last d_conv - 1 of the previous step (the conv state), then SiLU;
3. q and k are L2-normalized per head (x / sqrt(sum x^2 + eps)), q scaled by 1/sqrt(head_k), and
   repeated to the v heads tiled (v head h reads q/k head h % k_heads);
4. per token t and v head, with g = softplus(alpha + dt_bias) * a (a < 0) and b = sigmoid(beta),
   the state S [head_k, head_v] is decayed, corrected towards v along k, and read along q:

       S = exp(g) S;   S += k (b (v - S^T k))^T;   o = S^T q

5. o is RMS-normed per head (`norm`), times silu(z); the out-projection follows (model.py).

Steps 2-5 are one call of the kernel set's `delta_net_step` (kernels/delta_net_step.py: C on the
CPU, Triton on CUDA) over every row of the step: each sequence's tokens in order, decode rows and
prompt rows alike, the sequences read from the batch's AttnMeta tensors (so a step graph replays
it). At Qwen3.5-0.8B's shapes on 2 cores: 0.14-0.25 ms a layer a decode step at b=1, where the torch
ops took 0.8, and 28-37 ms a layer a 512-token prompt (playground/delta_net_speed.py), where torch's
chunked (WY) form of the delta rule (transformers' torch_chunk_gated_delta_rule, llama.cpp's
build_delta_net_chunking), which it replaced, took 75: the C scan keeps each head's 64 KB state in
cache from token to token and reads and writes it once a token. The states live in runtime/recurrent_state.py, one row
per KV stream.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from slotserver.runtime.batch import Batch
from slotserver.runtime.recurrent_state import RecurrentState


@dataclass
class GdnParams:
    """A delta-net layer's weights besides its two matmuls (model/recurrent_layer.py)."""

    conv: torch.Tensor      # [conv_dim, d_conv] float32: the causal depthwise convolution's taps
    dt_bias: torch.Tensor   # [v_heads] float32
    a: torch.Tensor         # [v_heads] float32: -exp(A_log)
    norm: torch.Tensor      # [head_v] float32: RMSNorm weight of each head's output

    def run(self, spec, proj: torch.Tensor, batch: Batch, state: RecurrentState, layer: int, ops) -> torch.Tensor:
        """proj: [T, proj_dim] the layer's in-projection of every row -> [T, value_dim] in proj's
        dtype, the gated and normed outputs (before the out-projection); the streams' states updated."""
        r, meta, row = spec.recurrent, batch.attn, state.row[layer]
        return ops.delta_net_step(proj, state.conv[row], state.ssm[row], meta.seq_streams, meta.q_offsets, meta.q_lens,
                                  self.conv, self.dt_bias, self.a, self.norm, r.n_k_heads, spec.norm_eps)[0]
