"""kernels/paged_attention.py's Triton kernels over a paged KV cache (a block table of pages):
flash-decoding (`_paged_decode_kernel`, merged by _attention_tl.py's `_decode_combine_kernel`)
and the causal prefill-chunk kernel (`_paged_prefill_kernel`); `_page_rows` finds a cell's page.
paged_attention.py launches them and holds the tile constants; the contract and the CPU forms are there too.
A part of paged_attention.py (runtime/kernel_parts.py).
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
def _page_rows(table_ptr, table_row, cells, c_mask, PAGE: tl.constexpr):
    """(page, row in page) of each logical cell of the stream whose table row starts at
    `table_row`; page 0 for masked cells (never loaded through)."""
    page = tl.load(table_ptr + table_row + cells // PAGE, mask=c_mask, other=0).to(tl.int64)
    return page, cells % PAGE


@_triton.jit
def _paged_decode_kernel(q_ptr, k_ptr, v_ptr, out_ptr, m_ptr, l_ptr, acc_ptr, table_ptr, streams_ptr, kv_lens_ptr,
                         q_offsets_ptr, sinks_ptr, stride_qt, stride_qh, stride_kb, stride_kr, stride_kh, stride_vb,
                         stride_vr, stride_vh, stride_bt, stride_ot, stride_oh, qk_scale, window, softcap,
                         GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, PAGE: tl.constexpr,
                         BLOCK_G: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
                         SOFTCAP: tl.constexpr, DOT: tl.constexpr, IEEE_DOT: tl.constexpr, SPLIT: tl.constexpr,
                         SINKS: tl.constexpr, SAME_KV: tl.constexpr):
    """Program (sequence b, KV head h, split i): b's one new token, its GROUP query heads, over the
    i-th of `tl.num_programs(2)` equal chunks (whole BLOCK_N tiles) of b's cells from its window's
    first (0 without one) to kv_len, looked up through the block table (flash-decoding; see
    attention.py's `_attn_decode_kernel`: SPLIT writes the chunk's partial m/l/acc at [b, q_head, i]
    for `_decode_combine_kernel`, DOT runs scores and P@V as tl.dot over >= 16 padded rows)."""
    b = tl.program_id(0)
    h = tl.program_id(1)
    split = tl.program_id(2)
    n_splits = tl.num_programs(2)
    stream = tl.load(streams_ptr + b).to(tl.int64) * stride_bt
    kv_len = tl.load(kv_lens_ptr + b)
    row = tl.load(q_offsets_ptr + b).to(tl.int64)
    lo = tl.where(window > 0, tl.maximum(kv_len - window, 0), 0)
    chunk = tl.cdiv(tl.cdiv(kv_len - lo, n_splits), BLOCK_N) * BLOCK_N
    start = lo + split * chunk
    end = tl.minimum(start + chunk, kv_len)
    g = tl.arange(0, BLOCK_G)
    d = tl.arange(0, BLOCK_D)
    g_mask = g < GROUP
    d_mask = d < HEAD_DIM
    gd_mask = g_mask[:, None] & d_mask[None, :]
    q = tl.load(q_ptr + row * stride_qt + (h * GROUP + g)[:, None] * stride_qh + d[None, :],
                mask=gd_mask, other=0.0)                                           # [BLOCK_G, BLOCK_D]
    qf = q.to(tl.float32) * qk_scale
    m_i = tl.full([BLOCK_G], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, BLOCK_D], tl.float32)
    for first in range(start, end, BLOCK_N):
        cells = first + tl.arange(0, BLOCK_N)
        c_mask = cells < end
        page, r = _page_rows(table_ptr, stream, cells, c_mask, PAGE)
        nd_mask = c_mask[:, None] & d_mask[None, :]
        k_off = (page * stride_kb + r * stride_kr)[:, None] + h * stride_kh + d[None, :]   # [BLOCK_N, BLOCK_D] int64
        if SAME_KV:   # K and V pages of one layout: one set of offsets (served d 128: 122 -> 104 registers)
            v_off = k_off
        else:
            v_off = (page * stride_vb + r * stride_vr)[:, None] + h * stride_vh + d[None, :]
        k = tl.load(k_ptr + k_off, mask=nd_mask, other=0.0)
        v = tl.load(v_ptr + v_off, mask=nd_mask, other=0.0)
        if DOT:
            s = _dot(q, tl.trans(k.to(q.dtype)), IEEE_DOT) * qk_scale                 # [BLOCK_G, BLOCK_N]
        else:
            s = tl.sum(qf[:, None, :] * k.to(tl.float32)[None, :, :], axis=2)
        if SOFTCAP:
            s = _softcap(s, softcap)
        s = tl.where(c_mask[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        if DOT:
            pv = _dot(p.to(q.dtype), v.to(q.dtype), IEEE_DOT)
        else:
            pv = tl.sum(p[:, :, None] * v.to(tl.float32)[None, :, :], axis=1)
        acc = acc * alpha[:, None] + pv
        m_i = m_new
    _decode_result(acc, m_i, l_i, row, g, d, g_mask, gd_mask, m_ptr, l_ptr, acc_ptr, out_ptr, sinks_ptr,
                   stride_ot, stride_oh, GROUP, HEAD_DIM, SPLIT, SINKS)


@_triton.jit
def _paged_tile(q, acc, m_i, l_i, k_ptr, v_ptr, table_ptr, stream, h, stride_kb, stride_kr, stride_kh, stride_vb,
                stride_vr, stride_vh, start, hi, pos, window, qk_scale, softcap, d, d_mask, PAGE: tl.constexpr,
                BLOCK_N: tl.constexpr, IEEE_DOT: tl.constexpr, SOFTCAP: tl.constexpr, MASK: tl.constexpr,
                EVEN_D: tl.constexpr):
    """One [BLOCK_N, head_dim] K/V tile of the pages folded into the running (acc, max, sum), as
    attention.py's `_prefill_tile`: MASK where the tile crosses a row's causal or window bound, else
    neither the scores nor (EVEN_D) the K/V loads are masked (every cell lies below `hi`)."""
    cells = start + tl.arange(0, BLOCK_N)
    c_mask = cells < hi
    page, pr = _page_rows(table_ptr, stream, cells, c_mask, PAGE)
    k_ptrs = k_ptr + (page * stride_kb + pr * stride_kr)[:, None] + h * stride_kh + d[None, :]
    v_ptrs = v_ptr + (page * stride_vb + pr * stride_vr)[:, None] + h * stride_vh + d[None, :]
    if MASK or not EVEN_D:
        nd_mask = c_mask[:, None] & d_mask
        k = tl.load(k_ptrs, mask=nd_mask, other=0.0).to(q.dtype)               # an f16 cache under f32/bf16 q
        v = tl.load(v_ptrs, mask=nd_mask, other=0.0).to(q.dtype)
    else:
        k = tl.load(k_ptrs).to(q.dtype)
        v = tl.load(v_ptrs).to(q.dtype)
    return _fold_tile(q, k, v, acc, m_i, l_i, cells, c_mask, pos, window, qk_scale, softcap, IEEE_DOT, SOFTCAP, MASK)


@_triton.jit
def _paged_prefill_kernel(q_ptr, k_ptr, v_ptr, out_ptr, table_ptr, streams_ptr, q_lens_ptr, kv_lens_ptr,
                          q_offsets_ptr, sinks_ptr, stride_qt, stride_qh, stride_kb, stride_kr, stride_kh, stride_vb,
                          stride_vr, stride_vh, stride_bt, stride_ot, stride_oh, qk_scale, window, softcap,
                          GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, PAGE: tl.constexpr,
                          BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
                          IEEE_DOT: tl.constexpr, SOFTCAP: tl.constexpr, SINKS: tl.constexpr):
    """Program (sequence b, KV head h, row tile): a causal chunk against the paged cache; rows fold
    the GQA group (row r: query r // GROUP, head h*GROUP + r % GROUP), as in attention.py, whose
    prefill kernel says why row tiles run last first, why the scale sits in the exponent and why
    the tiles below the tile's first position run unmasked (`MASK=False`)."""
    b = tl.program_id(0)
    h = tl.program_id(1)
    tile = tl.num_programs(2) - 1 - tl.program_id(2)
    q_len = tl.load(q_lens_ptr + b)
    if tile * BLOCK_M >= q_len * GROUP:
        return
    stream = tl.load(streams_ptr + b).to(tl.int64) * stride_bt
    kv_len = tl.load(kv_lens_ptr + b)
    q_off = tl.load(q_offsets_ptr + b).to(tl.int64)
    r = tile * BLOCK_M + tl.arange(0, BLOCK_M)
    r_mask = r < q_len * GROUP
    pos = kv_len - q_len + r // GROUP                                           # [BLOCK_M]
    d = tl.arange(0, BLOCK_D)
    d_mask = d[None, :] < HEAD_DIM
    rows = (q_off + r // GROUP)[:, None] * stride_qt + (h * GROUP + r % GROUP)[:, None] * stride_qh + d[None, :]
    q = tl.load(q_ptr + rows, mask=r_mask[:, None] & d_mask, other=0.0)          # [BLOCK_M, BLOCK_D]
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    lo, mid, hi = _prefill_bounds(pos, r_mask, kv_len, window, BLOCK_N)
    for start in range(lo, mid, BLOCK_N):
        acc, m_i, l_i = _paged_tile(q, acc, m_i, l_i, k_ptr, v_ptr, table_ptr, stream, h, stride_kb, stride_kr,
                                    stride_kh, stride_vb, stride_vr, stride_vh, start, hi, pos, window, qk_scale,
                                    softcap, d, d_mask, PAGE, BLOCK_N, IEEE_DOT, SOFTCAP, False, BLOCK_D == HEAD_DIM)
    for start in range(mid, hi, BLOCK_N):
        acc, m_i, l_i = _paged_tile(q, acc, m_i, l_i, k_ptr, v_ptr, table_ptr, stream, h, stride_kb, stride_kr,
                                    stride_kh, stride_vb, stride_vr, stride_vh, start, hi, pos, window, qk_scale,
                                    softcap, d, d_mask, PAGE, BLOCK_N, IEEE_DOT, SOFTCAP, True, BLOCK_D == HEAD_DIM)
    o_rows = (q_off + r // GROUP)[:, None] * stride_ot + (h * GROUP + r % GROUP)[:, None] * stride_oh + d[None, :]
    if SINKS:
        sk = tl.load(sinks_ptr + h * GROUP + r % GROUP, mask=r_mask, other=0.0) * 1.4426950408889634
        out = acc * _sink_norm(m_i, l_i, sk)[:, None]
    else:
        out = acc / l_i[:, None]
    tl.store(out_ptr + o_rows, out.to(out_ptr.dtype.element_ty), mask=r_mask[:, None] & d_mask)
