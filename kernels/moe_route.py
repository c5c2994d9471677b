"""moe_route: a mixture-of-experts layer's router and top-k gating, llama.cpp's `build_moe_ffn` head.

`(ids [T, k] int64, weights [T, k] float32) = route(h [T, d], W [E, d] float64)`:
logits = h @ W^T (summed in float64, rounded to float32 once: a token's logits are the same floats
whatever its batch, see slotserver/model/moe.py), plus `bias` [E] float32 where given (gpt-oss's
router bias, added to the rounded logits as ggml adds it); gating 0 = softmax over the E logits, 1 =
softmax_weight (gpt-oss: the raw logits, softmax over the k selected), 2 = sigmoid of each logit
(lfm2moe); the k largest (descending; ties to the lower id) of those probabilities plus
`select_bias` [E] float32 where given (lfm2moe's `exp_probs_b`, DeepSeek-V3's selection bias: it
picks the experts, never weights them); their unbiased values as weights; `norm`: divided by their
sum (clamped at 6.1e-5, as llama.cpp); times `scale` where it is not 1.

Why a kernel (C) rather than torch in the model: these few small ops were the only torch
computation left in a MoE decode step; as one C call the step is replayable from a step graph
(slotserver/model/step_graph.py) like a dense model's, the expert ids reaching moe_matmul through
a tensor's contents.

TOL: the reference computes the same float64 sums and float32 softmax in torch; the ids must be
equal (compare_outputs: an id off by one is an error of 1), the weights within float32 rounding.
"""

from __future__ import annotations

import torch
import triton as _triton
import triton.language as tl

from slotserver.runtime import native

OP = "moe_route"
FUSES = ("bias", "select_bias")   # optional: the router bias (gpt-oss), the selection bias (lfm2moe)
TOL = {torch.float32: 1e-5, torch.bfloat16: 1e-5}
WEIGHT_SUM_MIN = 6.103515625e-5


def reference(h: torch.Tensor, router: torch.Tensor, k: int, gating: int = 0, norm: bool = False,
              scale: float = 1.0, bias: torch.Tensor | None = None,
              select_bias: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """llama.cpp's order: logits (+ bias), probabilities, top k of them (+ select_bias), their
    values, softmax (gating 1), renormalize, scale."""
    logits = (h.double() @ router.double().T).float()                  # [T, E]
    if bias is not None:
        logits = logits + bias.float()
    probs = logits.softmax(-1) if gating == 0 else (torch.sigmoid(logits) if gating == 2 else logits)
    chosen = probs if select_bias is None else probs + select_bias.float()
    ids = _topk_ids(chosen, k)                                         # [T, k], largest first
    w = probs.gather(1, ids)
    if gating == 1:
        w = w.softmax(-1)
    if norm:
        w = w / w.sum(-1, keepdim=True).clamp_min(WEIGHT_SUM_MIN)
    if scale != 1.0:
        w = w * scale
    return ids, w


def _topk_ids(x: torch.Tensor, k: int) -> torch.Tensor:
    """The k largest of each row, descending, ties to the lower index (the kernels' order: topk's
    own order among equal values is unspecified, and a bias makes exact ties likelier)."""
    order = torch.sort(x, dim=-1, descending=True, stable=True).indices
    return order[:, :k]


NATIVE_C = native.c_source(__file__, "moe_route.c")
_LIB = native.build("moe_route", NATIVE_C, origin=native.c_path(__file__, "moe_route.c"), strict=True)
native.signature(_LIB, "moe_route", 6, 5, (native.ctypes.c_int, native.ctypes.c_int, native.ctypes.c_float,
                                           native.ctypes.c_int), replay=True)


def cpu(h: torch.Tensor, router: torch.Tensor, k: int, gating: int = 0, norm: bool = False,
        scale: float = 1.0, bias: torch.Tensor | None = None,
        select_bias: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The C kernel for float32 rows (unit stride), a contiguous float64 router and contiguous
    float32 biases (or none); else `reference`."""
    if (_LIB is None or h.dtype != torch.float32 or h.dim() != 2 or h.stride(1) != 1 or router.dtype != torch.float64
            or not router.is_contiguous() or not h.is_cpu or router.shape[0] > 4096 or not 0 < k <= router.shape[0]
            or not all(b is None or (b.dtype == torch.float32 and b.is_contiguous() and b.is_cpu
                                     and b.shape == router.shape[:1]) for b in (bias, select_bias))):
        return reference(h, router, k, gating, norm, scale, bias, select_bias)
    t = h.shape[0]
    ids = torch.empty(t, k, dtype=torch.int64)
    w = torch.empty(t, k, dtype=torch.float32)
    rc = _LIB.moe_route(h.data_ptr(), router.data_ptr(), 0 if bias is None else bias.data_ptr(),
                        0 if select_bias is None else select_bias.data_ptr(), ids.data_ptr(),
                        w.data_ptr(), t, h.shape[1], router.shape[0],
                        k, h.stride(0), gating, norm, scale, torch.get_num_threads())
    assert rc == 0, f"moe_route: failed ({rc})"
    return ids, w


@_triton.jit
def _route_kernel(h_ptr, w_ptr, b_ptr, s_ptr, ids_ptr, wt_ptr, D, E, K_USED, stride_h, GATING: tl.constexpr,
                  BLOCK_E: tl.constexpr, BLOCK_D: tl.constexpr, BIAS: tl.constexpr, SEL: tl.constexpr):
    """Program t (a token row): its E logits as float64 sums rounded to float32 (+ the bias: BIAS), softmax (GATING 0)
    or sigmoid (2), then K_USED times the largest remaining value (+ the selection bias: SEL; ties: the lowest id)
    -> ids, its unbiased value -> weights."""
    t = tl.program_id(0).to(tl.int64)
    es = tl.arange(0, BLOCK_E)
    emask = es < E
    acc = tl.zeros([BLOCK_E], dtype=tl.float64)
    for d0 in range(0, D, BLOCK_D):
        ds = d0 + tl.arange(0, BLOCK_D)
        dmask = ds < D
        x = tl.load(h_ptr + t * stride_h + ds, mask=dmask, other=0.0).to(tl.float64)
        w = tl.load(w_ptr + es[:, None].to(tl.int64) * D + ds[None, :], mask=emask[:, None] & dmask[None, :], other=0.0)
        acc += tl.sum(w * x[None, :], axis=1)
    p = acc.to(tl.float32)
    if BIAS:
        p = p + tl.load(b_ptr + es, mask=emask, other=0.0)
    if GATING == 0:
        mx = tl.max(tl.where(emask, p, float("-inf")), 0)
        p = tl.where(emask, tl.exp(p - mx), 0.0)
        p = p / tl.sum(p, 0)
    if GATING == 2:
        p = 1.0 / (1.0 + tl.exp(-p))
    q = p
    if SEL:
        q = p + tl.load(s_ptr + es, mask=emask, other=0.0)
    q = tl.where(emask, q, float("-inf"))
    for j in range(0, K_USED):
        best = tl.max(q, 0)
        idx = tl.min(tl.where(q == best, es, BLOCK_E), 0)
        tl.store(ids_ptr + t * K_USED + j, idx.to(tl.int64))
        tl.store(wt_ptr + t * K_USED + j, tl.sum(tl.where(es == idx, p, 0.0), 0))
        q = tl.where(es == idx, float("-inf"), q)


def triton(h: torch.Tensor, router: torch.Tensor, k: int, gating: int = 0, norm: bool = False,
           scale: float = 1.0, bias: torch.Tensor | None = None,
           select_bias: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Same contract as `cpu`: logits, softmax or sigmoid and selection in the kernel (one program
    per token); the k weights' softmax (gating 1), renormalization and scale in torch on the device."""
    t, e = h.shape[0], router.shape[0]
    h = h.float() if h.stride(-1) == 1 else h.float().contiguous()
    router = router.double().contiguous()
    ids = torch.empty(t, k, dtype=torch.int64, device=h.device)
    w = torch.empty(t, k, dtype=torch.float32, device=h.device)
    if t:
        b = router if bias is None else bias.float().contiguous()   # unused without a bias
        sel = router if select_bias is None else select_bias.float().contiguous()
        _route_kernel[(t,)](h, router, b, sel, ids, w, h.shape[1], e, k, h.stride(0), GATING=gating,
                            BLOCK_E=max(16, _triton.next_power_of_2(e)), BLOCK_D=32, BIAS=bias is not None,
                            SEL=select_bias is not None)
    if gating == 1:
        w = w.softmax(-1)
    if norm:
        w = w / w.sum(-1, keepdim=True).clamp_min(WEIGHT_SUM_MIN)
    return ids, (w * scale if scale != 1.0 else w)


def example_inputs(gen: torch.Generator, dtype: torch.dtype) -> tuple:
    """Router logits of every size llama.cpp's MoE archs use (4-160 experts, 1-8 used), the three
    gatings, with and without renormalization and scale, a third with a router bias (gpt-oss), a
    third with a selection bias (lfm2moe). Always float32 rows: the model's MoE activations are."""
    e = int(torch.randint(4, 161, (), generator=gen))
    k = int(torch.randint(1, min(e, 8) + 1, (), generator=gen))
    d = int(torch.randint(8, 200, (), generator=gen))
    t = int(torch.randint(1, 13, (), generator=gen))   # one program a token, each alike: a few (the interpreter)
    h = torch.randn(t, d, generator=gen)
    router = (torch.randn(e, d, generator=gen) / d ** 0.5).double()
    gating, norm = int(torch.randint(3, (), generator=gen)), bool(torch.randint(2, (), generator=gen))
    scale = 1.0 if torch.randint(2, (), generator=gen) else 2.5
    bias = torch.randn(e, generator=gen) if torch.rand((), generator=gen) < 0.33 else None
    select_bias = 0.3 * torch.randn(e, generator=gen) if torch.rand((), generator=gen) < 0.33 else None
    return h, router, k, gating, norm, scale, bias, select_bias


def _aot(gating: int, block_e: int, bias: bool = False, sel: bool = False) -> tuple:
    sig = {"h_ptr": "*fp32", "w_ptr": "*fp64", "b_ptr": "*fp32" if bias else "*fp64",
           "s_ptr": "*fp32" if sel else "*fp64", "ids_ptr": "*i64",
           "wt_ptr": "*fp32", "D": "i32", "E": "i32", "K_USED": "i32", "stride_h": "i32", "GATING": "constexpr",
           "BLOCK_E": "constexpr", "BLOCK_D": "constexpr", "BIAS": "constexpr", "SEL": "constexpr"}
    return (_route_kernel, sig, {"GATING": gating, "BLOCK_E": block_e, "BLOCK_D": 32, "BIAS": bias, "SEL": sel})


# the last two: gpt-oss-20b (32 experts, biased); LFM2-8B-A1B (32 experts, sigmoid, a selection bias)
AOT = [_aot(0, 128), _aot(1, 32), _aot(1, 32, bias=True), _aot(2, 32, sel=True)]
