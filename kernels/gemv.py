"""gemv: `y[M, N] = x[M, K] @ W^T` for a decode step's few rows (M <= SMALL_M) on dense weights, with
the ops around a transformer's matmuls fused into its prologue and epilogue: one launch where the
CUDA step ran two to four (model/gemv_step.py, `--fused-gemv`).

Why: a Qwen2.5-0.5B decode step on an H100, replayed from a CUDA graph, took 1.12 ms against 0.34 ms
of bytes (docs/gpu.md, third round): ~10 kernels a layer of 3-8 us each (cuBLAS's small-M kernels
with split-K and a separate reduce, the norm, rope, the activation), each a fixed latency whatever
its bytes. Fewer, bigger kernels is what closes that gap, not faster ones.

Fusions (`FUSES`; every one optional, each the unfused floats up to the dot's summation order):
- `norm` (prologue): x is the float32 residual and W multiplies `rms_norm(x) * norm` rounded to W's
  dtype, as kernels/rms_norm.py's `out_dtype` stores it. Every program recomputes its rows' sum of
  squares (K floats a row, from L2): the norm's launch is gone.
- `bias` (epilogue): + bias[n], before the rounding (cuBLAS's bias epilogue does the same).
- `glu` (epilogue, "silu" | "gelu"): W is gate|up concatenated along N ([2F, K], as Linear stores
  gate_up); each program computes its columns j of both halves and stores act(g) * u, [M, F]: no
  [M, 2F] intermediate, no silu_mul launch. g and u are rounded to W's dtype first, as the unfused
  silu_mul / gelu_mul read them.
- `rope` (epilogue, cos/sin [M, P], head_dim, rope_cols): columns below rope_cols (the q and k heads
  of a q|k|v projection) are rotated as kernels/rope.py does, pair (2i, 2i+1) of each head by angle
  i (pairs past P pass through). GGUF's neox models have their q/k rows permuted at load
  (model/weights.py), so at run time every model's pairs are adjacent columns: any even column
  block holds whole pairs.
- `acc` (epilogue): acc[M, N] float32 += y rounded to W's dtype (the residual add of wo / down; the
  same floats as `x += y` after the matmul), acc returned.

Tiling (`plan`, first guesses from ptxas's counts, not yet from a card's clock: GemvPlan's fields
are what `playground/gpu_gemv_bench.py --tune` sweeps): each program owns BLOCK_N output columns
(BLOCK_N whole weight rows, or BLOCK_N gate and BLOCK_N up rows) and every row of x, and walks K in
BLOCK_K steps, the weight tile [BLOCK_N, BLOCK_K] loaded along its contiguous K (16-byte vector
loads); no split-K partials, so a row's floats never depend on the launch order. Up to
BROADCAST_MAX_M rows the product is broadcast multiply-adds into [M, N, K] float32 lanes, summed
over K once after the loop (a tl.dot would pad the rows to 16 and shuffle the tile into the MMA
layout; a sum every step cost sm_90 14-24 barriers a step); above, a tl.dot on 16 rows, its weight
tiles streamed through shared memory by cp.async (num_stages). BLOCK_N shrinks until about
PROGRAMS_PER_SM programs an SM: Qwen2.5-0.5B's down (N 896, K 4864) gets 2-column programs (448)
where 64-column ones would fill 14 of 132 SMs; Llama-8B's down (K 14336) 8-column ones (512, each
reading 229 KB in 1024-wide steps), so one program a row block still fills the card without split-K.
The kernel's code is this module's part _gemv_kernel.py (runtime/kernel_parts.py); its launch is here.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
import triton as _triton

from slotserver.runtime import kernel_parts
from slotserver.runtime.gpu_info import interpreted, sm_count

_kernel = kernel_parts.load(__file__, "_gemv_kernel.py")   # the Triton kernel (jit code); launched below
_gemv_kernel = _kernel._gemv_kernel

OP = "gemv"
TOL = {torch.float32: 1e-4, torch.bfloat16: 3e-2}
FUSES = ("norm", "bias", "glu", "rope", "acc")
SMALL_M = 16                # rows this kernel serves (a decode step's); more: cuBLAS
BROADCAST_MAX_M = 4         # up to these rows the broadcast product; above, tl.dot on 16 rows
PROGRAMS_PER_SM = 2         # BLOCK_N shrinks until about this many programs per SM
TILE_VALUES = 8192          # BLOCK_M * BLOCK_N * BLOCK_K of the broadcast product: 16 KB of bf16 weights a step
MAX_BLOCK_K = 2048          # the broadcast product's K step (4096 at 2 columns: ptxas spills 8 bytes)
FMA_WARPS = 8               # its warps: 32 float32 accumulators a thread (4 warps: 64, and spills at BLOCK_K 4096)
GLU_CODES = {"": 0, "silu": 1, "gelu": 2}


@dataclass(frozen=True)
class GemvPlan:
    """One launch's tiling (see the module docstring); validated: tl.dot needs 16 in every dim."""

    block_m: int
    block_n: int
    block_k: int
    dot: bool
    num_warps: int = 4
    num_stages: int = 3

    def __post_init__(self) -> None:
        for name in ("block_m", "block_n", "block_k", "num_warps"):
            v = getattr(self, name)
            if v < 1 or v & (v - 1):
                raise ValueError(f"GemvPlan.{name} must be a power of two, got {v}")
        if self.dot and min(self.block_m, self.block_n, self.block_k) < 16:
            raise ValueError(f"tl.dot needs every block >= 16, got {self}")
        if self.block_n < 2:
            raise ValueError("block_n must hold whole rope pairs (>= 2)")


def plan(m: int, n: int, k: int, sms: int, glu: bool = False) -> GemvPlan:
    """The tiling for m rows, n output columns (gate|up: its d_ff), depth k, on a card of `sms` SMs."""
    target = max(1, PROGRAMS_PER_SM * sms)
    block_n = 1 << max(0, (n // target).bit_length() - 1)        # the power of two <= n / target
    if m > BROADCAST_MAX_M:
        return GemvPlan(16, min(64, max(16, block_n)), 64 if glu else 128, True)
    block_m = _pow2_at_least(m)
    block_n = min(16, max(2, block_n))
    values = TILE_VALUES // (2 if glu else 1)
    block_k = min(_pow2_at_least(k), MAX_BLOCK_K, max(64, values // (block_m * block_n)))
    return GemvPlan(block_m, block_n, block_k, False, FMA_WARPS)


def _pow2_at_least(v: int) -> int:
    """triton.next_power_of_2 without importing triton (the module's AOT list is built at load, and
    serving on CPU must not import it: runtime/lazy_triton.py)."""
    return 1 << max(0, v - 1).bit_length()


def reference(x, w, bias=None, glu="", norm=None, eps=1e-6, acc=None, cos=None, sin=None, head_dim=0, rope_cols=0):
    """The unfused ops in float32, rounded where the unfused step stores: x [M, K] (float32 when
    `norm`), w [N, K] -> [M, N] (glu: [M, N / 2]) in w's dtype, or acc (float32 [M, N]) += that."""
    if norm is not None:
        xf = x.float()
        x = xf * torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + eps) * norm.float()
    y = x.to(w.dtype).float() @ w.float().T                                     # [M, N]
    y = (y if bias is None else y + bias.float()).to(w.dtype)
    if glu:
        g, u = y.float().chunk(2, dim=-1)
        z = g if glu == "silu" else 1.5957691216057308 * (g + 0.044715 * g ** 3)
        y = (g / (1 + torch.exp(-z)) * u).to(w.dtype)
    if cos is not None:
        y = _rope_reference(y, cos, sin, head_dim, rope_cols)
    return y if acc is None else acc.add_(y.float())


def _rope_reference(y, cos, sin, head_dim, rope_cols):
    """kernels/rope.py's rotation (pairs 2i, 2i+1 of each head) on the first rope_cols columns."""
    m, rot = y.shape[0], 2 * cos.shape[1]
    heads = y[:, :rope_cols].float().view(m, rope_cols // head_dim, head_dim)
    pairs = heads[..., :rot].unflatten(-1, (rot // 2, 2))                     # [M, heads, P, 2]
    c, s = cos.float()[:, None], sin.float()[:, None]                           # [M, 1, P]
    turned = torch.stack([pairs[..., 0] * c - pairs[..., 1] * s, pairs[..., 0] * s + pairs[..., 1] * c], -1)
    heads = torch.cat([turned.flatten(-2), heads[..., rot:]], dim=-1)
    return torch.cat([heads.flatten(1).to(y.dtype), y[:, rope_cols:]], dim=1)


def cpu(x, w, bias=None, glu="", norm=None, eps=1e-6, acc=None, cos=None, sin=None, head_dim=0, rope_cols=0):
    """The same ops with torch (no CPU body calls this: the CPU fuses in kernels/qmatmul.c)."""
    if norm is not None:
        x = F.rms_norm(x.float(), (x.shape[-1],), norm.float(), eps)
    y = F.linear(x.to(w.dtype), w, None if bias is None else bias.to(w.dtype))
    if glu:
        g, u = y.float().chunk(2, dim=-1)
        y = ((F.silu(g) if glu == "silu" else F.gelu(g, approximate="tanh")) * u).to(w.dtype)
    if cos is not None:
        y = _rope_reference(y, cos, sin, head_dim, rope_cols)
    return y if acc is None else acc.add_(y.float())


def triton(x, w, bias=None, glu="", norm=None, eps=1e-6, acc=None, cos=None, sin=None, head_dim=0, rope_cols=0,
           tiling: GemvPlan | None = None):
    """Same contract as `cpu`, for x of at most SMALL_M rows (the model sends more to cuBLAS).
    tiling: a GemvPlan instead of `plan`'s (playground/gpu_gemv_bench.py's sweep)."""
    m, k = x.shape
    n = w.shape[0] // (2 if glu else 1)
    _check(x, w, bias, glu, norm, acc, cos, sin, head_dim, rope_cols)
    out = acc if acc is not None else torch.empty((m, n), dtype=w.dtype, device=w.device)
    if m == 0 or n == 0:
        return out
    p = tiling or plan(m, n, k, sm_count(w.device), bool(glu))
    dummy = w
    cs = cos if cos is not None else dummy
    _gemv_kernel[(_triton.cdiv(n, p.block_n),)](
        x, w, bias if bias is not None else dummy, norm if norm is not None else dummy, out, cs,
        sin if sin is not None else dummy, out, m, n, k, x.stride(0), w.stride(0), out.stride(0),
        cs.stride(0) if cos is not None else 0, out.stride(0), eps, max(head_dim, 1), rope_cols,
        cos.shape[1] if cos is not None else 0,
        BLOCK_M=p.block_m, BLOCK_N=p.block_n, BLOCK_K=p.block_k, DOT=p.dot,
        IEEE=w.dtype == torch.float32 or interpreted(), NORM=norm is not None,
        BIAS=bias is not None, GLU=GLU_CODES[glu], ROPE=cos is not None, ACC=acc is not None,
        num_warps=p.num_warps, num_stages=p.num_stages)
    return out


def _check(x, w, bias, glu, norm, acc, cos, sin, head_dim, rope_cols) -> None:
    """The launch's preconditions, as one readable assertion each."""
    m, k = x.shape
    n = w.shape[0] // (2 if glu else 1)
    assert m <= SMALL_M, f"gemv serves at most {SMALL_M} rows, got {m}"
    assert x.stride(1) == 1 and w.stride(1) == 1 and w.shape[1] == k, f"x {tuple(x.shape)} / w {tuple(w.shape)}"
    assert glu in GLU_CODES and not (glu and (bias is not None or w.shape[0] % 2)), "glu: [2F, K] gate|up, no bias"
    assert norm is None or (norm.shape == (k,) and norm.stride(0) == 1), "norm: a contiguous [K]"
    assert norm is not None or x.dtype == w.dtype, f"x ({x.dtype}) must be in w's dtype ({w.dtype}) without norm"
    assert acc is None or (acc.shape == (m, n) and acc.dtype == torch.float32 and acc.stride(1) == 1)
    if cos is not None:
        assert not glu and head_dim % 2 == 0 and rope_cols % head_dim == 0 and rope_cols <= n
        assert cos.shape == sin.shape == (m, cos.shape[1]) and 2 * cos.shape[1] <= head_dim
        assert cos.stride() == sin.stride() and cos.stride(1) == 1


def example_inputs(gen: torch.Generator, dtype: torch.dtype) -> tuple:
    """1-16 rows, odd widths, one fusion set of five (plain, bias, norm + glu, norm + bias + rope, acc)."""
    r = lambda lo, hi: int(torch.randint(lo, hi, (), generator=gen))   # noqa: E731
    m, k, case = r(1, SMALL_M + 1), r(1, 200), r(0, 5)
    n = 2 * r(1, 40) if case == 2 else r(1, 90)
    x = torch.randn(m, k, generator=gen)
    w = (torch.randn(n, k, generator=gen) / max(1, k) ** 0.5).to(dtype)
    bias = (torch.randn(n, generator=gen)).to(dtype) if case in (1, 3) else None
    norm = (1 + 0.1 * torch.randn(k, generator=gen)) if case in (2, 3) else None
    x = x if norm is not None else x.to(dtype)
    if case == 2:
        return x, w, None, ("silu", "gelu")[r(0, 2)], norm, 1e-6
    if case == 3:
        hd = 2 * r(1, 6)
        heads = r(1, n // hd + 1) if n >= hd else 0
        theta = torch.rand(m, r(1, hd // 2 + 1), generator=gen) * 10
        return x, w, bias, "", norm, 1e-6, None, theta.cos(), theta.sin(), hd, heads * hd
    acc = torch.randn(m, n, generator=gen) if case == 4 else None
    return x, w, bias, "", None, 1e-6, acc


def bench_inputs(device: str, small: bool = False) -> list[tuple[str, tuple]]:
    """`lab check --time` (eager, L2 flushed): the b=1 gate|up (norm + silu) and down (x += y) of
    Qwen2.5-0.5B and Llama-8B, and Llama's gate|up at 8 rows (tl.dot); bf16 weights."""
    sizes = [(1, 24, 40), (1, 40, 24)] if small else [(1, 4864, 896), (1, 896, 4864), (1, 14336, 4096), (1, 4096, 14336),
                                         (8, 14336, 4096)]
    out = []
    for i, (m, n, k) in enumerate(sizes):
        x = torch.randn(m, k, device=device)
        if i % 2 == 0:   # gate|up: the float32 residual normed in the prologue, silu(g) * u stored
            w = torch.randn(2 * n, k, device=device, dtype=torch.bfloat16) * 0.02
            out.append((f"{m} x {k} -> 2*{n} norm+silu", (x, w, None, "silu", torch.ones(k, device=device), 1e-6)))
        else:            # down: bf16 rows, added into the float32 residual
            w = torch.randn(n, k, device=device, dtype=torch.bfloat16) * 0.02
            out.append((f"{m} x {k} -> {n} x+=y", (x.bfloat16(), w, None, "", None, 1e-6,
                                                   torch.zeros(m, n, device=device))))
    return out


# what the JIT sees as multiples of 16 at every served shape (torch's pointers; Qwen2.5 / Llama widths)
ALIGNED = ("x_ptr", "w_ptr", "b_ptr", "nw_ptr", "acc_ptr", "cos_ptr", "sin_ptr", "y_ptr", "N", "K", "stride_x",
           "stride_w", "stride_acc", "stride_cs", "stride_y", "head_dim", "rope_cols", "n_rot_pairs")


def _aot(dt: str, p: GemvPlan, norm=False, bias=False, glu=0, rope=False, acc=False) -> tuple:
    sig = {"x_ptr": "*fp32" if norm else f"*{dt}", "w_ptr": f"*{dt}", "b_ptr": f"*{dt}", "nw_ptr": "*fp32",
           "acc_ptr": "*fp32", "cos_ptr": "*fp32", "sin_ptr": "*fp32", "y_ptr": f"*{dt}",
           **{a: "i32" for a in ("M", "N", "K", "stride_x", "stride_w", "stride_acc", "stride_cs", "stride_y",
                                 "head_dim", "rope_cols", "n_rot_pairs")}, "eps": "fp32",
           **{c: "constexpr" for c in ("BLOCK_M", "BLOCK_N", "BLOCK_K", "DOT", "IEEE", "NORM", "BIAS", "GLU", "ROPE", "ACC")}}
    consts = dict(BLOCK_M=p.block_m, BLOCK_N=p.block_n, BLOCK_K=p.block_k, DOT=p.dot, IEEE=dt == "fp32", NORM=norm,
                  BIAS=bias, GLU=glu, ROPE=rope, ACC=acc)
    return (_gemv_kernel, sig, consts, {"num_warps": p.num_warps, "num_stages": p.num_stages, "aligned": ALIGNED})


def _aot_specs() -> list[tuple]:
    """The GEMV body's launches as `plan` tiles them on an H100 (132 SMs): Qwen2.5-0.5B's four at b=1
    (the broadcast product), Llama-8B's down (K 14336), and two tl.dot forms at b=8; float32 once."""
    q, f, big = 896, 4864, 4096
    return [_aot("bf16", plan(1, q + 256, q, 132), norm=True, bias=True, rope=True),   # qkv + norm + bias + rope
            _aot("bf16", plan(1, q, q, 132), acc=True),                               # wo, x += y
            _aot("bf16", plan(1, f, q, 132, glu=True), norm=True, glu=1),             # gate_up + norm + silu * up
            _aot("bf16", plan(1, q, f, 132), acc=True),                               # down, x += y
            _aot("bf16", plan(1, big, 14336, 132), acc=True),                         # Llama-8B down
            _aot("bf16", plan(8, q + 256, q, 132), norm=True, bias=True, rope=True),
            _aot("bf16", plan(8, f, q, 132, glu=True), norm=True, glu=2),
            _aot("fp32", plan(1, 64, 64, 1), bias=True)]


AOT = _aot_specs()
