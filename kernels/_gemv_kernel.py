"""kernels/gemv.py's Triton kernel: `_gemv_kernel` (one program per BLOCK_N output columns, every row
of x, K walked in BLOCK_K steps) and its pieces: the norm prologue (`_inv_rms`, `_x_tile`), the two
products (`_dot_loop`: tl.dot on 16 rows; `_fma_loop`: broadcast multiply-adds for up to
BROADCAST_MAX_M rows) and the rope epilogue (`_rotate`). gemv.py plans the tiles (`plan`), launches
it and holds the contract. A part of gemv.py (runtime/kernel_parts.py).
"""

from __future__ import annotations

import triton as _triton
import triton.language as tl


@_triton.jit
def _inv_rms(x_ptr, stride_x, rows, mmask, K, eps, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr):
    """[BLOCK_M] 1 / sqrt(mean(x^2) + eps) of the rows (the norm prologue's first pass over x), the
    squares summed per lane and reduced once after the loop (no shuffles or barriers a step)."""
    ss = tl.zeros([BLOCK_M, BLOCK_K], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        kk = k0 + tl.arange(0, BLOCK_K)
        xv = tl.load(x_ptr + rows[:, None] * stride_x + kk[None, :], mask=mmask[:, None] & (kk < K)[None, :],
                     other=0.0).to(tl.float32)                                  # [BLOCK_M, BLOCK_K]
        ss += xv * xv
    return tl.rsqrt(tl.sum(ss, axis=1) / K + eps)


@_triton.jit
def _x_tile(x_ptr, nw_ptr, w_rows, stride_x, rows, mmask, inv, kk, kmask, NORM: tl.constexpr):
    """x's [BLOCK_M, BLOCK_K] tile as W's dtype: with NORM, rms_norm's float32 row times its weight,
    rounded to W's dtype as rms_norm's `out_dtype` stores it."""
    h = tl.load(x_ptr + rows[:, None] * stride_x + kk[None, :], mask=mmask[:, None] & kmask[None, :], other=0.0)
    if NORM:
        nw = tl.load(nw_ptr + kk, mask=kmask, other=0.0).to(tl.float32)
        h = h.to(tl.float32) * inv[:, None] * nw[None, :]
    return h.to(w_rows.dtype.element_ty)


@_triton.jit
def _dot_loop(x_ptr, w_rows, u_rows, nw_ptr, stride_x, rows, mmask, nmask, inv, K,
              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, IEEE: tl.constexpr,
              NORM: tl.constexpr, GLU: tl.constexpr):
    """[BLOCK_M, BLOCK_N] float32 sums of x @ W^T (and of the up rows with GLU), a tl.dot a K step.
    IEEE: the dot in float32 without tf32 rounding (float32 weights, and the interpreter, whose
    tl.dot multiplies bf16 bit patterns as integers: kernels/attention.py)."""
    acc_g = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    acc_u = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        kk = k0 + tl.arange(0, BLOCK_K)
        kmask = kk < K
        h = _x_tile(x_ptr, nw_ptr, w_rows, stride_x, rows, mmask, inv, kk, kmask, NORM)
        wmask = nmask[:, None] & kmask[None, :]
        wt = tl.load(w_rows + kk[None, :], mask=wmask, other=0.0)                  # [BLOCK_N, BLOCK_K]
        if IEEE:
            acc_g += tl.dot(h.to(tl.float32), tl.trans(wt.to(tl.float32)), input_precision="ieee")
        else:
            acc_g += tl.dot(h, tl.trans(wt))
        if GLU != 0:
            ut = tl.load(u_rows + kk[None, :], mask=wmask, other=0.0)
            if IEEE:
                acc_u += tl.dot(h.to(tl.float32), tl.trans(ut.to(tl.float32)), input_precision="ieee")
            else:
                acc_u += tl.dot(h, tl.trans(ut))
    return acc_g, acc_u


@_triton.jit
def _fma_loop(x_ptr, w_rows, u_rows, nw_ptr, stride_x, rows, mmask, nmask, inv, K,
              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, NORM: tl.constexpr,
              GLU: tl.constexpr):
    """The same sums as `_dot_loop` by broadcast multiply-adds into [BLOCK_M, BLOCK_N, BLOCK_K] float32
    registers, reduced over K once after the loop (a reduction each step costs shuffles and barriers).
    x is loaded at the product's full shape (each thread its own copy of the K values it multiplies,
    from L1): a [BLOCK_M, BLOCK_K] tile would be re-laid through shared memory every step."""
    zero_n = tl.zeros([1, BLOCK_N, 1], dtype=tl.int32)
    r3 = rows[:, None, None] + zero_n                                              # [BLOCK_M, BLOCK_N, 1]
    m3 = mmask[:, None, None] & (zero_n == 0)
    n3 = nmask[None, :, None]
    inv3 = inv[:, None, None]
    acc_g = tl.zeros([BLOCK_M, BLOCK_N, BLOCK_K], dtype=tl.float32)
    acc_u = tl.zeros([BLOCK_M, BLOCK_N, BLOCK_K], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        kk = k0 + tl.arange(0, BLOCK_K)[None, None, :]                             # [1, 1, BLOCK_K]
        kmask = kk < K
        h = tl.load(x_ptr + r3 * stride_x + kk, mask=m3 & kmask, other=0.0)        # [BLOCK_M, BLOCK_N, BLOCK_K]
        if NORM:
            nw = tl.load(nw_ptr + kk + r3 * 0, mask=m3 & kmask, other=0.0).to(tl.float32)
            h = h.to(tl.float32) * inv3 * nw
        h = h.to(w_rows.dtype.element_ty).to(tl.float32)
        wmask = n3 & kmask
        acc_g += h * tl.load(w_rows[None, :, :] + kk, mask=wmask, other=0.0).to(tl.float32)
        if GLU != 0:
            acc_u += h * tl.load(u_rows[None, :, :] + kk, mask=wmask, other=0.0).to(tl.float32)
    return tl.sum(acc_g, axis=2), tl.sum(acc_u, axis=2)


@_triton.jit
def _rotate(y, cos_ptr, sin_ptr, stride_cs, rows, mmask, n0, head_dim, rope_cols, n_rot_pairs,
            BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """kernels/rope.py's turn of adjacent pairs on y [BLOCK_M, BLOCK_N] (columns n0...): column 2i
    and 2i+1 of a head below rope_cols by that row's angle i; other pairs unchanged (cos 1, sin 0)."""
    col = n0 + 2 * tl.arange(0, BLOCK_N // 2)                                  # [BLOCK_N / 2] even column
    p = (col % head_dim) // 2                                                  # pair within its head
    rot = (col < rope_cols) & (p < n_rot_pairs)
    cmask = mmask[:, None] & rot[None, :]
    c = tl.load(cos_ptr + rows[:, None] * stride_cs + p[None, :], mask=cmask, other=1.0).to(tl.float32)
    s = tl.load(sin_ptr + rows[:, None] * stride_cs + p[None, :], mask=cmask, other=0.0).to(tl.float32)
    y0, y1 = tl.split(tl.reshape(y, [BLOCK_M, BLOCK_N // 2, 2]))               # even, odd columns
    return tl.reshape(tl.join(y0 * c - y1 * s, y0 * s + y1 * c), [BLOCK_M, BLOCK_N])


@_triton.jit
def _gemv_kernel(x_ptr, w_ptr, b_ptr, nw_ptr, acc_ptr, cos_ptr, sin_ptr, y_ptr,
                 M, N, K, stride_x, stride_w, stride_acc, stride_cs, stride_y, eps, head_dim, rope_cols, n_rot_pairs,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, DOT: tl.constexpr, IEEE: tl.constexpr,
                 NORM: tl.constexpr, BIAS: tl.constexpr, GLU: tl.constexpr, ROPE: tl.constexpr, ACC: tl.constexpr):
    """Program: output columns [n0, n0 + BLOCK_N) of every row (N: the output's columns; with GLU the
    up rows are N rows below the gate rows). The K loop reads each weight byte once."""
    n0 = tl.program_id(0) * BLOCK_N
    rows = tl.arange(0, BLOCK_M)                                               # [BLOCK_M]
    cols = n0 + tl.arange(0, BLOCK_N)                                          # [BLOCK_N]
    mmask, nmask = rows < M, cols < N
    wdt = w_ptr.dtype.element_ty
    w_rows = w_ptr + cols.to(tl.int64)[:, None] * stride_w                     # [BLOCK_N, 1]
    u_rows = w_rows + N * stride_w                                             # GLU: the up rows
    inv = tl.zeros([BLOCK_M], dtype=tl.float32)
    if NORM:
        inv = _inv_rms(x_ptr, stride_x, rows, mmask, K, eps, BLOCK_M, BLOCK_K)
    if DOT:
        acc_g, acc_u = _dot_loop(x_ptr, w_rows, u_rows, nw_ptr, stride_x, rows, mmask, nmask, inv, K,
                                 BLOCK_M, BLOCK_N, BLOCK_K, IEEE, NORM, GLU)
    else:
        acc_g, acc_u = _fma_loop(x_ptr, w_rows, u_rows, nw_ptr, stride_x, rows, mmask, nmask, inv, K,
                                 BLOCK_M, BLOCK_N, BLOCK_K, NORM, GLU)
    y = acc_g
    if BIAS:
        y += tl.load(b_ptr + cols, mask=nmask, other=0.0).to(tl.float32)[None, :]
    y = y.to(wdt).to(tl.float32)                                               # the unfused matmul's rounding
    if GLU != 0:
        u = acc_u.to(wdt).to(tl.float32)
        z = y if GLU == 1 else 1.5957691216057308 * (y + 0.044715 * y * y * y)  # gelu_tanh = g * sigmoid(z)
        y = (y / (1.0 + tl.exp(-z)) * u).to(wdt).to(tl.float32)
    if ROPE:
        y = _rotate(y, cos_ptr, sin_ptr, stride_cs, rows, mmask, n0, head_dim, rope_cols, n_rot_pairs, BLOCK_M, BLOCK_N)
    omask = mmask[:, None] & nmask[None, :]
    if ACC:
        a_ptrs = acc_ptr + rows[:, None] * stride_acc + cols[None, :]
        tl.store(a_ptrs, tl.load(a_ptrs, mask=omask, other=0.0) + y, mask=omask)
    else:
        tl.store(y_ptr + rows[:, None] * stride_y + cols[None, :], y.to(y_ptr.dtype.element_ty), mask=omask)
