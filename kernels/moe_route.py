"""moe_route: a mixture-of-experts layer's router and top-k gating, llama.cpp's `build_moe_ffn` head.

`(ids [T, k] int64, weights [T, k] float32) = route(h [T, d], W [E, d] float64)`:
logits = h @ W^T (summed in float64, rounded to float32 once: a token's logits are the same floats
whatever its batch, see slotserver/model/moe.py); gating 0 = softmax over the E logits, 1 =
softmax_weight (gpt-oss: the raw logits, softmax over the k selected); the k largest (descending;
ties to the lower id); their values as weights; `norm`: divided by their sum (clamped at 6.1e-5, as
llama.cpp); times `scale` where it is not 1.

Why a kernel (C) rather than torch in the model: these few small ops were the only torch
computation left in a MoE decode step; as one C call the step is replayable from a step graph
(slotserver/model/step_graph.py) like a dense model's, the expert ids reaching moe_matmul through
a tensor's contents.

TOL: the reference computes the same float64 sums and float32 softmax in torch; the ids must be
equal (compare_outputs: an id off by one is an error of 1), the weights within float32 rounding.
"""

from __future__ import annotations

import torch

from slotserver.runtime import native

OP = "moe_route"
TOL = {torch.float32: 1e-5, torch.bfloat16: 1e-5}
WEIGHT_SUM_MIN = 6.103515625e-5


def reference(h: torch.Tensor, router: torch.Tensor, k: int, gating: int = 0, norm: bool = False,
              scale: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """llama.cpp's order: probabilities, top k of them, their values, softmax (gating 1), renormalize, scale."""
    logits = (h.double() @ router.double().T).float()                  # [T, E]
    probs = logits.softmax(-1) if gating == 0 else logits
    ids = probs.topk(k, dim=-1).indices                                # [T, k], largest first
    w = probs.gather(1, ids)
    if gating == 1:
        w = w.softmax(-1)
    if norm:
        w = w / w.sum(-1, keepdim=True).clamp_min(WEIGHT_SUM_MIN)
    if scale != 1.0:
        w = w * scale
    return ids, w


NATIVE_C = native.c_source(__file__, "moe_route.c")
_LIB = native.build("moe_route", NATIVE_C, origin=native.c_path(__file__, "moe_route.c"), strict=True)
native.signature(_LIB, "moe_route", 4, 5, (native.ctypes.c_int, native.ctypes.c_int, native.ctypes.c_float,
                                           native.ctypes.c_int), replay=True)


def cpu(h: torch.Tensor, router: torch.Tensor, k: int, gating: int = 0, norm: bool = False,
        scale: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """The C kernel for float32 rows (unit stride) and a contiguous float64 router; else `reference`."""
    if (_LIB is None or h.dtype != torch.float32 or h.dim() != 2 or h.stride(1) != 1 or router.dtype != torch.float64
            or not router.is_contiguous() or not h.is_cpu or router.shape[0] > 4096 or not 0 < k <= router.shape[0]):
        return reference(h, router, k, gating, norm, scale)
    t = h.shape[0]
    ids = torch.empty(t, k, dtype=torch.int64)
    w = torch.empty(t, k, dtype=torch.float32)
    rc = _LIB.moe_route(h.data_ptr(), router.data_ptr(), ids.data_ptr(), w.data_ptr(), t, h.shape[1], router.shape[0],
                        k, h.stride(0), gating, norm, scale, torch.get_num_threads())
    assert rc == 0, f"moe_route: failed ({rc})"
    return ids, w


def triton(h: torch.Tensor, router: torch.Tensor, k: int, gating: int = 0, norm: bool = False,
           scale: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """On the GPU: the same torch ops on the device (softmax and top-k over a few hundred logits per
    token are launches, not work; torch's are already fused kernels), so no Triton kernel of its own."""
    return reference(h, router, k, gating, norm, scale)


def example_inputs(gen: torch.Generator, dtype: torch.dtype) -> tuple:
    """Router logits of every size llama.cpp's MoE archs use (4-160 experts, 1-8 used), both gatings,
    with and without renormalization and scale. Always float32 rows: the model's MoE activations are."""
    e = int(torch.randint(4, 161, (), generator=gen))
    k = int(torch.randint(1, min(e, 8) + 1, (), generator=gen))
    d = int(torch.randint(8, 200, (), generator=gen))
    t = int(torch.randint(1, 70, (), generator=gen))
    h = torch.randn(t, d, generator=gen)
    router = (torch.randn(e, d, generator=gen) / d ** 0.5).double()
    gating, norm = int(torch.randint(2, (), generator=gen)), bool(torch.randint(2, (), generator=gen))
    scale = 1.0 if torch.randint(2, (), generator=gen) else 2.5
    return h, router, k, gating, norm, scale
