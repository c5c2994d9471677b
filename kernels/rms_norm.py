"""rms_norm: `y = x / sqrt(mean(x^2) + eps) * weight`, llama.cpp's RMS_NORM followed by MUL.

Contract (every kernel module): `OP`, `reference(...)` in plain torch (the ground truth), `cpu(...)`
(the implementation the CPU engine calls), `triton(...)` (same signature, what a CUDA engine
calls), `example_inputs(gen, dtype)` for validation, `TOL`, and `AOT` (compile specs for the
ahead-of-time check: `(jit_fn, signature, constexprs)`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton as _triton
import triton.language as tl

from slotserver.runtime import kernel_parts, native

_q8 = kernel_parts.load(__file__, "_q8_1.py")   # q8_1: the quantizer the integer matmuls read (qmatmul_gpu)
_quantize_into = _q8._quantize_into

OP = "rms_norm"
TOL = {torch.float32: 1e-5, torch.bfloat16: 2e-2}


# Fusions (FUSES, optional arguments of every implementation; see kernels/qmatmul.py):
# - `acc`, the residual add after a post-norm (gemma2/3's branch outputs: x = x + rms_norm(y)).
#   Why: a torch add between two C calls is a computation a decode step graph cannot replay
#   (slotserver/model/step_graph.py), so gemma3's every step ran its ~230 calls through Python (~5
#   ms of a ~33 ms b=1 step on a 2-core AVX2 host).
# - `add`, the residual add before the next pre-norm (x += y; then x is normed), and `out_dtype`,
#   the normed rows stored in the matmul's dtype (float32 residual -> bf16 activations) instead of
#   a cast after. Why: on CUDA a decode step is launch-bound (docs/gpu.md, second round: ~16
#   launches a layer at 2-5 us each, 1.35 ms against 0.34 ms of bytes); add + norm + cast were
#   three launches, twice a layer, and are one (model/lean_step.py). The same floats as unfused.
# - `q8_1`, buffers (int8 q [tokens, dim], float32 d and s [tokens, dim / 32]: `_q8_1.buffers`)
#   filled with the q8_1 of the normed rows as stored (dim a multiple of 32). Why: qmatmul_gpu's wide
#   and int8 products quantize x in a launch of their own before each matmul (qkv, gate_up: twice a
#   layer); given these (its `x_q8`) they read them instead: the same values (one `_quantize32`),
#   one launch fewer per matmul input (model/lean_step.py).
# A module without FUSES (or without one of them) is called unfused.
FUSES = ("acc", "add", "out_dtype", "q8_1")


def reference(x: torch.Tensor, weight: torch.Tensor, eps: float, acc: torch.Tensor | None = None,
              add: torch.Tensor | None = None, out_dtype: torch.dtype | None = None,
              q8_1: tuple[torch.Tensor, ...] | None = None) -> torch.Tensor:
    """x: [tokens, dim] or [tokens, heads, dim] (normed over the last dim), weight: [dim] -> x's
    shape, computed in float32, rounded to `out_dtype` (default x's dtype). acc (x's shape): that
    result is added into it, and acc is returned. add ([tokens, dim], any float dtype): first
    added into x in place (x += add, rounded to x's dtype: the residual stream), then x is normed.
    q8_1: the result's q8_1 written into these buffers (FUSES above; `_q8_1.torch_q8_1`)."""
    if add is not None:
        x.add_(add.to(x.dtype))
    xf = x.float()
    y = (xf * torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + eps) * weight.float()).to(out_dtype or x.dtype)
    if q8_1 is not None:
        _q8.torch_q8_1(y, q8_1)
    return y if acc is None else acc.add_(y.to(acc.dtype))


# One pass per row in C (kernels/rms_norm.c), the sum of squares and the scaled store.
NATIVE_C = native.c_source(__file__, "rms_norm.c")
_LIB = native.build("rms_norm", NATIVE_C, origin=native.c_path(__file__, "rms_norm.c"), strict=True)
native.signature(_LIB, "rms_norm", 3, 6, (native.ctypes.c_float,) + (native.ctypes.c_int,) * 5, replay=True)
_FLOATS = (torch.float32, torch.bfloat16)


def cpu(x: torch.Tensor, weight: torch.Tensor, eps: float, acc: torch.Tensor | None = None,
        add: torch.Tensor | None = None, out_dtype: torch.dtype | None = None,
        q8_1: tuple[torch.Tensor, ...] | None = None) -> torch.Tensor:
    """The C kernel where it applies (one call instead of ~7 small torch ops), else torch.
    `add` is torch's add_ before the norm and `q8_1` torch's quantization after it (the CPU model
    asks for neither: model/lean_step.py)."""
    if q8_1 is not None:
        y = cpu(x, weight, eps, add=add, out_dtype=out_dtype)
        _q8.torch_q8_1(y, q8_1)
        return y if acc is None else acc.add_(y.to(acc.dtype))
    if add is not None:
        x.add_(add.to(x.dtype))
    out_dtype = out_dtype or x.dtype
    if _native_fits(x, weight, acc) and out_dtype in _FLOATS and (out_dtype == x.dtype or x.dtype == torch.float32):
        rows, heads = (x.shape[0], 1) if x.dim() == 2 else x.shape[:2]
        out = torch.empty(x.shape, dtype=out_dtype) if acc is None else acc    # x's shape
        sh = x.stride(1) if x.dim() == 3 else 0
        rc = _LIB.rms_norm(x.data_ptr(), weight.data_ptr(), out.data_ptr(), rows, heads, x.shape[-1], x.stride(0), sh,
                           out.stride(-2),
                           eps, native.is_bf16(x), native.is_bf16(weight), acc is not None, native.is_bf16(out),
                           torch.get_num_threads())
        assert rc == 0, "rms_norm: out of memory"
        return out
    if x.dtype == torch.float32:  # 4 cheap ops: F.rms_norm's CPU path measured 1.2-1.4x slower in the model
        r = torch.linalg.vector_norm(x, dim=-1, keepdim=True).square_().div_(x.shape[-1]).add_(eps).rsqrt_()
        y = torch.mul(x, weight).mul_(r).to(out_dtype)
    else:
        y = F.rms_norm(x.float(), (x.shape[-1],), weight.float(), eps).to(out_dtype)
    return y if acc is None else acc.add_(y.to(acc.dtype))


def _native_fits(x: torch.Tensor, weight: torch.Tensor, acc: torch.Tensor | None) -> bool:
    """[tokens, dim] or [tokens, heads, dim] rows with a unit last stride (heads rows may be strided:
    q/k slices of a fused projection), float32/bf16; acc [tokens, dim] with unit last stride."""
    ok = (_LIB is not None and x.dim() in (2, 3) and x.is_cpu and weight.is_cpu and x.dtype in _FLOATS
          and weight.dtype in _FLOATS and x.stride(-1) == 1 and weight.is_contiguous() and weight.shape == x.shape[-1:])
    return ok and (acc is None or (acc.dim() == 2 and x.dim() == 2 and acc.shape == x.shape and acc.stride(1) == 1
                                   and acc.is_cpu and acc.dtype in _FLOATS))


# Rows a program on narrow rows: about NARROW_ELEMS values a program (896 columns: 4 rows, a per-head
# q/k norm's 128: 16) instead of one row. Why: one 1.8 KB row a program kept Qwen2.5-0.5B's norm at
# 54-63% of an H200's copy rate however many tokens (docs/gpu.md, sixth round) while the same rows
# with 3x the bytes a program (the fused add) reached 93%: the per-program cost, not the bytes.
# Depends on the width only, never on the row count: a row's floats do not change with the batch.
NARROW_ELEMS = 4096
MAX_ROWS_A_PROGRAM = 16


def rows_a_program(block: int) -> int:
    """Rows each program of `_rms_norm_kernel` norms, for rows padded to `block` columns."""
    return max(1, min(MAX_ROWS_A_PROGRAM, NARROW_ELEMS // block))


@_triton.jit
def _rms_norm_kernel(x_ptr, y_ptr, w_ptr, out_ptr, q_ptr, d_ptr, s_ptr, stride_x, stride_y, stride_out, n_rows,
                     n_cols, eps, BLOCK: tl.constexpr, ROWS: tl.constexpr, ADD: tl.constexpr, Q8: tl.constexpr):
    """ROWS rows a program (`rows_a_program`): each row loaded once, reduced in float32, scaled,
    stored in out's dtype. ADD: y's row is first added into x's (rounded to x's dtype and stored
    back, as torch's `x += y`), and the sum is what is normed. Q8: the stored rows' q8_1 (n_cols a
    multiple of 32) goes to q/d/s_ptr, rows n_cols and n_cols / 32 apart."""
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)                  # [ROWS]
    cols = tl.arange(0, BLOCK)
    row_ok = rows < n_rows
    mask = row_ok[:, None] & (cols < n_cols)[None, :]                                # [ROWS, BLOCK]
    x_ptrs = x_ptr + rows[:, None] * stride_x + cols[None, :]
    x = tl.load(x_ptrs, mask=mask, other=0.0).to(tl.float32)
    if ADD:
        y = tl.load(y_ptr + rows[:, None] * stride_y + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        x = (x + y).to(x_ptr.dtype.element_ty)
        tl.store(x_ptrs, x, mask=mask)
        x = x.to(tl.float32)
    w = tl.load(w_ptr + cols, mask=cols < n_cols, other=0.0).to(tl.float32)
    inv = tl.rsqrt(tl.sum(x * x, axis=1) / n_cols + eps)                              # [ROWS]
    out = (x * inv[:, None] * w[None, :]).to(out_ptr.dtype.element_ty)
    tl.store(out_ptr + rows[:, None] * stride_out + cols[None, :], out, mask=mask)
    if Q8:   # masked columns are 0: no block's max sees them
        nb: tl.constexpr = ROWS * BLOCK // 32
        b = tl.arange(0, BLOCK // 32)
        blocks = rows[:, None] * (n_cols // 32) + b[None, :]                          # [ROWS, BLOCK / 32]
        _quantize_into(tl.reshape(out.to(tl.float32), [nb, 32]),
                       q_ptr + tl.reshape(rows[:, None] * n_cols + cols[None, :], [nb, 32]),
                       d_ptr + tl.reshape(blocks, [nb]), s_ptr + tl.reshape(blocks, [nb]),
                       tl.reshape(row_ok[:, None] & (b < n_cols // 32)[None, :], [nb]))


def triton(x: torch.Tensor, weight: torch.Tensor, eps: float, acc: torch.Tensor | None = None,
           add: torch.Tensor | None = None, out_dtype: torch.dtype | None = None,
           q8_1: tuple[torch.Tensor, ...] | None = None) -> torch.Tensor:
    """Same contract as `cpu`. Rows may be strided; the last dim must be contiguous. `add`,
    `out_dtype` and `q8_1` cost no launch: one for add + norm + cast (+ quantize) (FUSES)."""
    if x.dim() == 3:   # [tokens, heads, dim]: the heads' rows as rows (a copy where they are strided)
        assert add is None and q8_1 is None, "add, q8_1: [tokens, dim] rows only"
        y = triton(x.reshape(-1, x.shape[-1]), weight, eps, out_dtype=out_dtype).view(x.shape)
        return y if acc is None else acc.add_(y.to(acc.dtype))
    assert x.dim() == 2 and x.stride(1) == 1, f"x must be [tokens, dim] with unit last stride, got {x.stride()}"
    assert weight.shape == (x.shape[1],) and weight.stride(0) == 1, "weight must be a contiguous [dim]"
    assert x.dtype in (torch.float32, torch.bfloat16, torch.float16) and x.device == weight.device
    if add is not None:
        assert add.shape == x.shape and add.stride(1) == 1 and add.device == x.device, \
            f"add must be x's shape {tuple(x.shape)} with unit last stride, got {tuple(add.shape)} {add.stride()}"
    if q8_1 is not None:
        _q8.check(q8_1, *x.shape, x.device)
    out = torch.empty(x.shape, dtype=out_dtype or x.dtype, device=x.device)
    if x.shape[0]:
        block = _triton.next_power_of_2(x.shape[1])
        y = x if add is None else add
        q, d, s = q8_1 if q8_1 is not None else (out, out, out)   # unread pointers without Q8
        rows = rows_a_program(block)
        _rms_norm_kernel[(_triton.cdiv(x.shape[0], rows),)](
            x, y, weight, out, q, d, s, x.stride(0), y.stride(0), out.stride(0), x.shape[0], x.shape[1], eps,
            BLOCK=block, ROWS=rows, ADD=add is not None, Q8=q8_1 is not None, num_warps=4 if block <= 2048 else 8)
    return out if acc is None else acc.add_(out.to(acc.dtype))


def example_inputs(gen: torch.Generator, dtype: torch.dtype) -> tuple:
    """[tokens, dim] rows, or one case in three [tokens, heads, dim] (a model's per-head q/k norm).
    No fusion arguments (`acc`, `add`, `out_dtype`, `q8_1`): the lab validates an edit on the serving
    module's inputs, and an edit without FUSES is called unfused, so it must pass without them.
    The fusions are checked against the unfused floats in tests/test_kernels.py (acc),
    tests/test_lean_step.py (add, out_dtype: the CPU forms, and the Triton one interpreted) and
    tests/test_qmatmul_gpu.py (q8_1: qmatmul_gpu's own quantizer's values)."""
    tokens = int(torch.randint(1, 40, (), generator=gen))
    dim = int(torch.randint(1, 300, (), generator=gen))
    heads = int(torch.randint(1, 5, (), generator=gen)) if int(torch.randint(0, 3, (), generator=gen)) == 0 else 0
    x = torch.randn(tokens, *((heads,) if heads else ()), dim, generator=gen).to(dtype)
    return x, (1 + 0.1 * torch.randn(dim, generator=gen)).to(dtype), 1e-5


def bench_inputs(device: str, small: bool = False) -> list[tuple[str, tuple]]:
    """`lab check --time`: bf16 rows of Qwen2.5-0.5B's and Llama-8B's widths, a float32 weight (as
    the model keeps norms), 8192 tokens (a prefill chunk) and 64 (a decode batch)."""
    sizes = [(7, 96)] if small else [(8192, 896), (8192, 4096), (64, 4096)]
    return [(f"{t} x {d}", (torch.randn(t, d, device=device, dtype=torch.bfloat16),
                            torch.ones(d, device=device), 1e-6)) for t, d in sizes]


def _aot(x: str, w: str, block: int, out: str | None = None, add: bool = False, q8: bool = False) -> tuple:
    sig = {"x_ptr": f"*{x}", "y_ptr": "*bf16" if add else f"*{x}", "w_ptr": f"*{w}", "out_ptr": f"*{out or x}",
           "q_ptr": "*i8" if q8 else f"*{out or x}", "d_ptr": "*fp32" if q8 else f"*{out or x}",
           "s_ptr": "*fp32" if q8 else f"*{out or x}", "stride_x": "i32", "stride_y": "i32", "stride_out": "i32",
           "n_rows": "i32", "n_cols": "i32", "eps": "fp32", "BLOCK": "constexpr", "ROWS": "constexpr",
           "ADD": "constexpr", "Q8": "constexpr"}
    return (_rms_norm_kernel, sig, {"BLOCK": block, "ROWS": rows_a_program(block), "ADD": add, "Q8": q8})


# float32 and bf16 rows (a per-head q/k norm's 128 columns and Qwen's 896: several rows a program); the
# CUDA step's fused forms: a float32 residual, a bf16 branch added, bf16
# out (Qwen2.5-0.5B's 896 columns, 8B-class 4096), and the first layer's norm + cast alone
AOT = [_aot("fp32", "fp32", 1024), _aot("bf16", "fp32", 4096), _aot("bf16", "fp32", 128), _aot("bf16", "fp32", 1024),
       _aot("fp32", "fp32", 1024, "bf16", add=True),
       _aot("fp32", "fp32", 4096, "bf16", add=True), _aot("fp32", "fp32", 1024, "bf16"),
       _aot("fp32", "fp32", 1024, "bf16", add=True, q8=True), _aot("fp32", "fp32", 4096, "bf16", add=True, q8=True)]
