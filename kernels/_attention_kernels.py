"""kernels/attention.py's Triton kernels over a strided KV view: flash-decoding (`_attn_decode_kernel`,
merged by _attention_tl.py's `_decode_combine_kernel`) and the causal prefill-chunk kernel
(`_attn_prefill_kernel`, one K/V tile at a time in `_prefill_tile`). attention.py launches them
(its `triton`, `_decode`) and holds the tile constants; the contract and the CPU forms are there too.
A part of attention.py (runtime/kernel_parts.py).
"""

from __future__ import annotations

import triton as _triton
import triton.language as tl

from slotserver.runtime import kernel_parts

_tl = kernel_parts.load(__file__, "_attention_tl.py")
_dot, _fold_tile, _softcap, _sink_norm = _tl._dot, _tl._fold_tile, _tl._softcap, _tl._sink_norm
_prefill_bounds = _tl._prefill_bounds
_decode_result = _tl._decode_result


@_triton.jit
def _attn_decode_kernel(q_ptr, k_ptr, v_ptr, ks_ptr, vs_ptr, out_ptr, m_ptr, l_ptr, acc_ptr, streams_ptr,
                        kv_lens_ptr, q_offsets_ptr, sinks_ptr, stride_qt, stride_qh, stride_ks, stride_kc, stride_kh,
                        stride_vs, stride_vc, stride_vh, stride_ss, stride_sc, stride_sh, stride_ot, stride_oh,
                        qk_scale, window, softcap,
                        GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_G: tl.constexpr,
                        BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr, QUANT: tl.constexpr,
                        SOFTCAP: tl.constexpr, DOT: tl.constexpr, IEEE_DOT: tl.constexpr, SPLIT: tl.constexpr,
                        SINKS: tl.constexpr):
    """Program (sequence b, KV head h, split i): the GROUP query heads of h for b's single new token
    over the i-th of `tl.num_programs(2)` chunks of b's visible cells (flash-decoding).

    b's cells run from its window's first (0 without one) to kv_len; they are cut into equal chunks
    (rounded up to BLOCK_N cells), so the masked cells on either side are never read and a chunk
    past kv_len reads nothing. SPLIT: the chunk's unnormalised partial (running max m, sum l and
    accumulator, log2 units) goes to m/l/acc_ptr at [b, q_head, i] for `_decode_combine_kernel`;
    without (one chunk) the output is written directly. K/V tiles are [BLOCK_N cells, head_dim]
    loaded along the contiguous head_dim through the view's strides (any strided layout); q8 rows
    are scaled per cell. DOT: scores and P@V as tl.dot with the group padded to BLOCK_G >= 16 rows
    (int8 rows converted exactly to q's dtype, their scales applied to the scores and to P); else
    a float32 broadcast-multiply-reduce. SINKS: each query head's sink logit (sinks_ptr, natural
    units) joins the denominator where the output is normalised (here, or in the combine kernel).
    """
    b = tl.program_id(0)
    h = tl.program_id(1)
    split = tl.program_id(2)
    n_splits = tl.num_programs(2)
    stream = tl.load(streams_ptr + b).to(tl.int64)
    kv_len = tl.load(kv_lens_ptr + b)
    row = tl.load(q_offsets_ptr + b).to(tl.int64)
    lo = tl.where(window > 0, tl.maximum(kv_len - window, 0), 0)
    chunk = tl.cdiv(tl.cdiv(kv_len - lo, n_splits), BLOCK_N) * BLOCK_N
    start = lo + split * chunk
    end = tl.minimum(start + chunk, kv_len)
    g = tl.arange(0, BLOCK_G)
    d = tl.arange(0, BLOCK_D)
    n = tl.arange(0, BLOCK_N)
    g_mask = g < GROUP
    d_mask = d < HEAD_DIM
    gd_mask = g_mask[:, None] & d_mask[None, :]
    q = tl.load(q_ptr + row * stride_qt + (h * GROUP + g)[:, None] * stride_qh + d[None, :],
                mask=gd_mask, other=0.0)                                           # [BLOCK_G, BLOCK_D]
    qf = q.to(tl.float32) * qk_scale
    k_base = k_ptr + stream * stride_ks + h * stride_kh
    v_base = v_ptr + stream * stride_vs + h * stride_vh
    s_base = stream * stride_ss + h * stride_sh
    m_i = tl.full([BLOCK_G], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, BLOCK_D], tl.float32)
    for first in range(start, end, BLOCK_N):
        cells = first + n
        c_mask = cells < end
        nd_mask = c_mask[:, None] & d_mask[None, :]
        k = tl.load(k_base + cells[:, None] * stride_kc + d[None, :], mask=nd_mask, other=0.0)
        v = tl.load(v_base + cells[:, None] * stride_vc + d[None, :], mask=nd_mask, other=0.0)
        if QUANT:
            k_sc = tl.load(ks_ptr + s_base + cells * stride_sc, mask=c_mask, other=0.0)
            v_sc = tl.load(vs_ptr + s_base + cells * stride_sc, mask=c_mask, other=0.0)
        if DOT:
            if QUANT:   # int8 -> float32 -> q's dtype: exact (|x| <= 127); the scales apply to s and p
                k = k.to(tl.float32)
                v = v.to(tl.float32)
            s = _dot(q, tl.trans(k.to(q.dtype)), IEEE_DOT) * qk_scale            # [BLOCK_G, BLOCK_N]
            if QUANT:
                s = s * k_sc[None, :]
        else:
            kf = k.to(tl.float32)
            if QUANT:
                kf = kf * k_sc[:, None]
            s = tl.sum(qf[:, None, :] * kf[None, :, :], axis=2)                   # [BLOCK_G, BLOCK_N]
        if SOFTCAP:
            s = _softcap(s, softcap)
        s = tl.where(c_mask[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        if DOT:
            if QUANT:
                p = p * v_sc[None, :]
            pv = _dot(p.to(q.dtype), v.to(q.dtype), IEEE_DOT)
        else:
            vf = v.to(tl.float32)
            if QUANT:
                vf = vf * v_sc[:, None]
            pv = tl.sum(p[:, :, None] * vf[None, :, :], axis=1)
        acc = acc * alpha[:, None] + pv
        m_i = m_new
    _decode_result(acc, m_i, l_i, row, g, d, g_mask, gd_mask, m_ptr, l_ptr, acc_ptr, out_ptr, sinks_ptr,
                   stride_ot, stride_oh, GROUP, HEAD_DIM, SPLIT, SINKS)


@_triton.jit
def _prefill_tile(q, acc, m_i, l_i, k_base, v_base, ks_ptr, vs_ptr, s_base, stride_kc, stride_vc, stride_sc,
                  start, hi, pos, window, qk_scale, softcap, n, d, d_mask, QUANT: tl.constexpr,
                  IEEE_DOT: tl.constexpr, SOFTCAP: tl.constexpr, MASK: tl.constexpr, EVEN_D: tl.constexpr,
                  TMA: tl.constexpr):
    """One [BLOCK_N, head_dim] K/V tile folded into the running (acc, max, sum). MASK: the tile
    crosses a row's causal or window bound; else every cell is seen by every row and lies below
    `hi`, so neither the scores nor (EVEN_D: head_dim fills BLOCK_D) the loads are masked.
    TMA: k_base and v_base are tensor descriptors of the sequence's [kv_len, head_dim] rows (the
    copy engine fetches the tile; cells past kv_len come back 0 and are masked in the scores).
    The softmax: _attention_tl.py's `_fold_tile`."""
    cells = start + n
    c_mask = cells < hi
    if TMA:   # k_base, v_base: descriptors
        k = k_base.load([tl.cast(start, tl.int32), 0])
        v = v_base.load([tl.cast(start, tl.int32), 0])
    else:
        k_ptrs = k_base + cells[:, None] * stride_kc + d[None, :]
        v_ptrs = v_base + cells[:, None] * stride_vc + d[None, :]
        if MASK or not EVEN_D:
            nd_mask = c_mask[:, None] & d_mask
            k = tl.load(k_ptrs, mask=nd_mask, other=0.0)
            v = tl.load(v_ptrs, mask=nd_mask, other=0.0)
        else:
            k = tl.load(k_ptrs)
            v = tl.load(v_ptrs)
    if QUANT:
        k = (k.to(tl.float32) * tl.load(ks_ptr + s_base + cells * stride_sc, mask=c_mask, other=0.0)[:, None])
        v = (v.to(tl.float32) * tl.load(vs_ptr + s_base + cells * stride_sc, mask=c_mask, other=0.0)[:, None])
    k, v = k.to(q.dtype), v.to(q.dtype)            # q8 (scaled above) or an f16 cache under f32/bf16 q
    return _fold_tile(q, k, v, acc, m_i, l_i, cells, c_mask, pos, window, qk_scale, softcap, IEEE_DOT, SOFTCAP, MASK)


@_triton.jit
def _attn_prefill_kernel(q_ptr, k_ptr, v_ptr, ks_ptr, vs_ptr, out_ptr, streams_ptr, q_lens_ptr, kv_lens_ptr,
                         q_offsets_ptr, sinks_ptr, stride_qt, stride_qh, stride_ks, stride_kc, stride_kh, stride_vs,
                         stride_vc, stride_vh, stride_ss, stride_sc, stride_sh, stride_ot, stride_oh, qk_scale,
                         window, softcap, GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
                         BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr, QUANT: tl.constexpr,
                         IEEE_DOT: tl.constexpr, SOFTCAP: tl.constexpr, SINKS: tl.constexpr, TMA: tl.constexpr):
    """Program (sequence b, KV head h, row tile): a causal chunk of b's new queries against its cache.

    Rows fold the GQA group into the query axis: row r is query j = r // GROUP, head h*GROUP + r % GROUP,
    at position kv_len - q_len + j. The KV loop stops at the tile's last position (causal bound)
    and, with a window, starts at the first cell the tile's first query sees. Without a window, the
    tiles below the tile's first position are seen by every row and skip the masks (`MASK=False`).
    Row tiles run last first: under a causal mask the last tiles read the most cells, and started
    first they do not leave a tail of long programs on a few SMs (FlashAttention-2's order).
    TMA (16-bit cache, BLOCK_D == HEAD_DIM, 16-byte aligned rows: the launcher checks): K/V tiles
    through tensor descriptors (Hopper's copy engine) instead of per-thread addresses.
    """
    b = tl.program_id(0)
    h = tl.program_id(1)
    tile = tl.num_programs(2) - 1 - tl.program_id(2)   # the last (longest) row tiles start first
    q_len = tl.load(q_lens_ptr + b)
    if tile * BLOCK_M >= q_len * GROUP:
        return
    stream = tl.load(streams_ptr + b).to(tl.int64)
    kv_len = tl.load(kv_lens_ptr + b)
    q_off = tl.load(q_offsets_ptr + b).to(tl.int64)
    r = tile * BLOCK_M + tl.arange(0, BLOCK_M)
    j = r // GROUP
    r_mask = r < q_len * GROUP
    pos = kv_len - q_len + j                                                     # [BLOCK_M]
    d = tl.arange(0, BLOCK_D)
    n = tl.arange(0, BLOCK_N)
    d_mask = d[None, :] < HEAD_DIM
    q_rows = (q_off + j)[:, None] * stride_qt + (h * GROUP + r % GROUP)[:, None] * stride_qh + d[None, :]
    q = tl.load(q_ptr + q_rows, mask=r_mask[:, None] & d_mask, other=0.0)       # [BLOCK_M, BLOCK_D]
    k_base = k_ptr + stream * stride_ks + h * stride_kh
    v_base = v_ptr + stream * stride_vs + h * stride_vh
    if TMA:
        rows = kv_len.to(tl.int32)
        k_base = tl.make_tensor_descriptor(k_base, shape=[rows, HEAD_DIM], strides=[stride_kc, 1],
                                           block_shape=[BLOCK_N, HEAD_DIM])
        v_base = tl.make_tensor_descriptor(v_base, shape=[rows, HEAD_DIM], strides=[stride_vc, 1],
                                           block_shape=[BLOCK_N, HEAD_DIM])
    s_base = stream * stride_ss + h * stride_sh
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    lo, mid, hi = _prefill_bounds(pos, r_mask, kv_len, window, BLOCK_N)
    for start in range(lo, mid, BLOCK_N):
        acc, m_i, l_i = _prefill_tile(q, acc, m_i, l_i, k_base, v_base, ks_ptr, vs_ptr, s_base, stride_kc,
                                      stride_vc, stride_sc, start, hi, pos, window, qk_scale, softcap, n, d,
                                      d_mask, QUANT, IEEE_DOT, SOFTCAP, False, BLOCK_D == HEAD_DIM, TMA)
    for start in range(mid, hi, BLOCK_N):
        acc, m_i, l_i = _prefill_tile(q, acc, m_i, l_i, k_base, v_base, ks_ptr, vs_ptr, s_base, stride_kc,
                                      stride_vc, stride_sc, start, hi, pos, window, qk_scale, softcap, n, d,
                                      d_mask, QUANT, IEEE_DOT, SOFTCAP, True, BLOCK_D == HEAD_DIM, TMA)
    if SINKS:   # each row's head's sink logit joins its denominator
        sk = tl.load(sinks_ptr + h * GROUP + r % GROUP, mask=r_mask, other=0.0) * 1.4426950408889634
        out = acc * _sink_norm(m_i, l_i, sk)[:, None]
    else:
        out = acc / l_i[:, None]
    o_rows = (q_off + j)[:, None] * stride_ot + (h * GROUP + r % GROUP)[:, None] * stride_oh + d[None, :]
    tl.store(out_ptr + o_rows, out.to(out_ptr.dtype.element_ty), mask=r_mask[:, None] & d_mask)
