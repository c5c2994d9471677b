"""What every branch of a layer goes through (a mixin of LlamaModel, model.py): a matmul with its
fusions (pre-norm, SiLU gate, residual add, LoRA delta), the residual add, and a branch's output
before it (post-norm, granite's multiplier). Each picks the C kernel call where the kernels fuse,
so that a decode step stays replayable as a step graph; the floats are the same either way.
"""

from __future__ import annotations

import torch

from slotserver.model.bias_add import add_bias
from slotserver.model.linear import QLinear
from slotserver.model.scaled_add import scaled_add


class BlockOps:
    """Needs `kernels`, `spec`, `weights` and `lora` on the model it is mixed into."""

    def _mm(self, fuse: bool, lin, x: torch.Tensor, norm: torch.Tensor | None = None, glu: bool = False,
            acc: torch.Tensor | None = None, lora: tuple | None = None) -> torch.Tensor:
        """lin(x) with the pre-norm (RMSNorm weight `norm`), the SiLU gate (x = gate|up) and the
        residual add (into `acc`, returned) fused into qmatmul where it fuses (GGUF blocks and a
        qmatmul with FUSES), else as the separate kernels: the same floats either way.
        lora: (layer, linear, None or (row scales, in C)): the adapters' delta of the normed / gated
        x; in C (model/lora_delta.py) added after the matmul, fused or not, into its output or the
        residual; else with torch before the residual add (the caller passes fuse=False then)."""
        if lora is not None and lora[2] is not None and lora[2][1]:
            out = self._mm(fuse, lin, x, norm, glu, acc)
            return self.lora.add_from(lora[:2], x, out, lora[2][0], self.kernels, norm, self.spec.norm_eps, glu)
        if fuse and isinstance(lin, QLinear):
            if acc is not None and lin.bias is not None and len(lin.parts) == 1 and norm is None and not glu \
                    and lin.op == "qmatmul":
                # gpt-oss's attn_output: x += a @ W^T in qmatmul, then += bias in C (add_bias), where
                # llama.cpp adds (a @ W^T + bias) + x: last-bit apart, but two C calls a step graph
                # replays (QLinear.fused would end in torch's add_)
                return add_bias(self.kernels.qmatmul(x.contiguous(), lin.parts[0], None, 0.0, False, acc), lin.bias)
            return lin.fused(x, self.kernels, norm, self.spec.norm_eps, glu, acc)
        ops = self.kernels
        if glu:
            x = ops.silu_mul(x)
        if norm is not None:
            x = as_dtype(ops.rms_norm(x, norm, self.spec.norm_eps), self.weights.act_dtype)
        y = lin(x, ops)
        if lora is not None and lora[2] is not None:
            y = self.lora.add(lora[:2], x, y, lora[2][0])
        return y if acc is None else acc.add_(y)

    def _residual_add(self, norm_adds: bool, x: torch.Tensor, y: torch.Tensor,
                      post_norm: torch.Tensor | None) -> torch.Tensor:
        """x + the branch output of y: in place, in the post-norm's C call, where rms_norm fuses the
        add (`norm_adds`: kernels/rms_norm.py FUSES), or in scaled_add's for granite's multiplier; a
        torch add would keep the step out of a step graph."""
        if norm_adds and post_norm is not None:
            return self.kernels.rms_norm(y, post_norm, self.spec.norm_eps, acc=x)
        if post_norm is None and self.spec.residual_scale != 1.0:   # granite's branch multiplier, in C
            return scaled_add(x, y, self.spec.residual_scale)
        return x + self._branch_out(y, post_norm)

    def _branch_out(self, y: torch.Tensor, post_norm: torch.Tensor | None) -> torch.Tensor:
        """An attention or FFN output before the residual add: post-normed (gemma2/3), scaled (granite)."""
        if post_norm is not None:
            y = self.kernels.rms_norm(y, post_norm, self.spec.norm_eps)
        if self.spec.residual_scale != 1.0:
            y = y * self.spec.residual_scale
        return y


def as_dtype(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """x in dtype; the check is cheaper than `.to`'s no-op dispatch (a decode step makes ~150)."""
    return x if x.dtype == dtype else x.to(dtype)
