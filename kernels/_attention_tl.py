"""Flash-attention pieces that kernels/attention.py and kernels/paged_attention.py share: the Triton
helpers both ops' kernels call (`_dot`, `_softcap`, `_sink_norm`, `_decode_result`), a split decode's
count and partials (`split_count`, `decode_partials`) and their flash-decoding merge
(`_decode_combine_kernel`, launched by `combine`). One file, not two copies:
the two ops differ in how they find a cell (strides or a page table), not in the softmax.
A part of each of the two modules (runtime/kernel_parts.py): each loads its own copy, validated,
versioned and reloaded with it, so an edit here re-validates and swaps both.
"""

from __future__ import annotations

import torch
import triton as _triton
import triton.language as tl


# The prefill kernels' tiles (attention.py's and paged_attention.py's `prefill_tiles`):
PREFILL_BLOCK_M = 32       # float32 (IEEE dots, the reference mode): small tiles, no spills
PREFILL_BLOCK_N = 32
# 16-bit q on a GPU: query rows (GQA group folded in) x cells per tile, warps, pipeline stages;
# PREFILL16 for head_dim <= 64, PREFILL16_WIDE to 128, PREFILL16_HUGE above (one constant each, so a
# card can tune them apart). Measured on an H200 (2026-11-28, docs/gpu.md, sixth round; 2048-token
# prefill, bf16, ours / SDPA kernel time replayed from a CUDA graph, Qwen2.5-0.5B B=1 / Llama-8B B=1
# / Qwen B=4 / Llama B=4): 64x64, 4 warps, 3 stages, TMA 1.12/0.92/0.93/0.77 (without TMA
# 1.09/0.90/0.92/0.75; the fourth round's kernel, before the last-first row order and the scale in
# the exponent: 0.92/0.77/0.80/0.70); 2 stages, TMA 1.05/0.86/0.89/0.68; 128x64 (8 warps, 3 stages, TMA)
# 1.01/0.90/0.69/0.77; 128x128 (8, 2, TMA) 0.95/0.80/0.65/0.66; 64x32 (4, 2, TMA)
# 0.73/0.78/0.82/0.67; 64x128 (4, 2, TMA) 1.12/0.57/0.76/0.46. The H100 round (2026-11-26, 3 stages,
# eager time) had 32x32 at 0.25-0.35 and 64x64 best as well. The paged prefill shares them: its page
# lookup adds index math per cell, not a different tiling.
PREFILL16 = {"BLOCK_M": 64, "BLOCK_N": 64, "num_warps": 4, "num_stages": 3}
PREFILL16_WIDE = {"BLOCK_M": 64, "BLOCK_N": 64, "num_warps": 4, "num_stages": 3}
# head_dim above 128 (gemma2's 256): the wide tiles take 229 KB of shared memory and spill on sm_90
# and do not fit an sm_80 SM; 32-cell tiles at 8 warps and 2 stages: 98 KB, no spills (ptxas sm_90;
# not timed on a card yet)
PREFILL16_HUGE = {"BLOCK_M": 64, "BLOCK_N": 32, "num_warps": 8, "num_stages": 2}


def prefill_tiles(dtype: torch.dtype, dim: int) -> dict:
    """The prefill kernels' tiles and launch options for q of `dtype` and head size `dim`."""
    if dtype == torch.float32:
        return {"BLOCK_M": PREFILL_BLOCK_M, "BLOCK_N": PREFILL_BLOCK_N}
    return PREFILL16_HUGE if dim > 128 else PREFILL16_WIDE if dim > 64 else PREFILL16


@_triton.jit
def _dot(a, b, IEEE_DOT: tl.constexpr):
    """`a @ b` accumulated in float32. IEEE_DOT multiplies in exact float32: for float32 caches
    (no tf32 rounding) and under the interpreter, whose tl.dot multiplies bf16 bit patterns as
    integers. Inputs are already rounded to their dtype, so the result matches a bf16 MMA."""
    if IEEE_DOT:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    return tl.dot(a, b)


@_triton.jit
def _dot_acc(a, b, acc, IEEE_DOT: tl.constexpr):
    """`acc + a @ b`, the sum in the MMA's float32 accumulator (one pass over acc less than
    `acc + _dot(a, b)`); IEEE_DOT as `_dot`."""
    if IEEE_DOT:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
    return tl.dot(a, b, acc)


@_triton.jit
def _prefill_bounds(pos, r_mask, kv_len, window, BLOCK_N: tl.constexpr):
    """A prefill row tile's cells (rows at positions `pos`, real where r_mask): [lo, hi) are what
    any row sees (the causal bound; a window's start), and [lo, mid) the whole BLOCK_N tiles every
    row sees, folded without masks (none with a window: its start differs by row)."""
    hi = tl.minimum(kv_len, tl.max(tl.where(r_mask, pos, 0), axis=0) + 1)
    first = tl.min(tl.where(r_mask, pos, kv_len), axis=0)                        # the tile's first position
    lo = tl.where(window > 0, tl.maximum(first - window + 1, 0), 0)
    mid = tl.where(window > 0, lo, tl.minimum(first + 1, hi) // BLOCK_N * BLOCK_N)
    return lo, mid, hi


@_triton.jit
def _fold_tile(q, k, v, acc, m_i, l_i, cells, c_mask, pos, window, qk_scale, softcap, IEEE_DOT: tl.constexpr,
               SOFTCAP: tl.constexpr, MASK: tl.constexpr):
    """A prefill K/V tile (k, v [BLOCK_N, BLOCK_D] in q's dtype, at `cells`) folded into the running
    (acc, max m_i, sum l_i; log2 units) of q's rows at positions `pos`; returns them updated. MASK: the
    tile crosses a row's causal or window bound (or `c_mask`'s end), else every row sees every cell.
    The scale goes into the exponent's FMA (`s * scale - max`), not a pass of its own over the
    scores (it is positive, so the max commutes with it); P @ V accumulates into acc in the MMA.
    Both ops' prefill kernels call it: they differ in how they find the tile, not in the softmax."""
    s = _dot(q, tl.trans(k), IEEE_DOT)                                          # [BLOCK_M, BLOCK_N], unscaled
    if SOFTCAP:
        s = _softcap(s * qk_scale, softcap)
        scale = 1.0
    else:
        scale = qk_scale
    if MASK:
        seen = (cells[None, :] <= pos[:, None]) & c_mask[None, :]
        seen = seen & ((cells[None, :] > pos[:, None] - window) | (window == 0))
        s = tl.where(seen, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, axis=1) * scale)
    if MASK:
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)   # a row with nothing seen yet: no NaN
    else:
        m_use = m_new                                          # every row has seen a cell
    alpha = tl.exp2(m_i - m_use)
    p = tl.exp2(s * scale - m_use[:, None])
    l_i = l_i * alpha + tl.sum(p, axis=1)
    acc = _dot_acc(p.to(v.dtype), v, acc * alpha[:, None], IEEE_DOT)
    return acc, m_new, l_i


@_triton.jit
def _softcap(s, softcap):
    """Scores in log2 units (`q.k * scale * log2 e`) soft-capped in natural units: c * tanh(x / c),
    tanh(y) = 1 - 2 / (e^{2y} + 1) (saturates cleanly at +-1 where e^{2y} overflows or vanishes)."""
    y = s / (1.4426950408889634 * softcap)
    return (softcap * 1.4426950408889634) * (1.0 - 2.0 / (tl.exp(2.0 * y) + 1.0))


@_triton.jit
def _sink_norm(m, l, sk):
    """1 / the softmax denominator with a sink (all in log2 units): running max m, sum l (relative
    to m), sink logit sk; M = max(m, sk): e^(m-M) / (l e^(m-M) + e^(sk-M)). A padded row (m = -inf,
    l = 0) gives 0, not NaN."""
    mx = tl.maximum(m, sk)
    e = tl.exp2(m - mx)
    return e / (l * e + tl.exp2(sk - mx))


@_triton.jit
def _decode_result(acc, m_i, l_i, row, g, d, g_mask, gd_mask, m_ptr, l_ptr, acc_ptr, out_ptr, sinks_ptr, stride_ot,
                   stride_oh, GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, SPLIT: tl.constexpr, SINKS: tl.constexpr):
    """The end of a decode program (sequence b, KV head h, split: its grid axes), both ops': SPLIT: its
    chunk's unnormalised partial (running max m_i, sum l_i, acc; log2 units) for `_decode_combine_kernel`;
    else the output rows of h's GROUP query heads (g), normalised here (SINKS: with each head's sink)."""
    b, h, split, n_splits = tl.program_id(0), tl.program_id(1), tl.program_id(2), tl.num_programs(2)
    if SPLIT:   # partial [b, q_head, split]: an empty chunk leaves m = -inf, l = 0, acc = 0
        part = (b * tl.num_programs(1) * GROUP + h * GROUP + g).to(tl.int64) * n_splits + split
        tl.store(m_ptr + part, m_i, mask=g_mask)
        tl.store(l_ptr + part, l_i, mask=g_mask)
        tl.store(acc_ptr + part[:, None] * HEAD_DIM + d[None, :], acc, mask=gd_mask)
    elif SINKS:
        sk = tl.load(sinks_ptr + h * GROUP + g, mask=g_mask, other=0.0) * 1.4426950408889634
        tl.store(out_ptr + row * stride_ot + (h * GROUP + g)[:, None] * stride_oh + d[None, :],
                 (acc * _sink_norm(m_i, l_i, sk)[:, None]).to(out_ptr.dtype.element_ty), mask=gd_mask)
    else:
        tl.store(out_ptr + row * stride_ot + (h * GROUP + g)[:, None] * stride_oh + d[None, :],
                 (acc / l_i[:, None]).to(out_ptr.dtype.element_ty), mask=gd_mask)


@_triton.jit
def _decode_combine_kernel(m_ptr, l_ptr, acc_ptr, out_ptr, q_offsets_ptr, sinks_ptr, n_splits, stride_ot,
                           stride_oh, HEAD_DIM: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr,
                                SINKS: tl.constexpr):
    """Program (sequence b, query head): the n_splits partials of a decode kernel
    (attention's or paged_attention's) merged,
    each rescaled to the largest running max (empty chunks weigh 0); SINKS: the head's sink logit
    joins the merged denominator (the max taken with it too)."""
    b = tl.program_id(0)
    head = tl.program_id(1)
    base = (b * tl.num_programs(1) + head).to(tl.int64) * n_splits
    i = tl.arange(0, BLOCK_S)
    d = tl.arange(0, BLOCK_D)
    i_mask = i < n_splits
    d_mask = d < HEAD_DIM
    m = tl.load(m_ptr + base + i, mask=i_mask, other=float("-inf"))
    l = tl.load(l_ptr + base + i, mask=i_mask, other=0.0)                       # noqa: E741
    acc = tl.load(acc_ptr + (base + i)[:, None] * HEAD_DIM + d[None, :], mask=i_mask[:, None] & d_mask[None, :],
                  other=0.0)                                                     # [BLOCK_S, BLOCK_D]
    if SINKS:
        sk = tl.load(sinks_ptr + head) * 1.4426950408889634
        mx = tl.maximum(tl.max(m, axis=0), sk)
        w = tl.exp2(m - mx)
        out = tl.sum(w[:, None] * acc, axis=0) / (tl.sum(w * l, axis=0) + tl.exp2(sk - mx))
    else:
        w = tl.exp2(m - tl.max(m, axis=0))                                       # -inf (empty) -> 0
        out = tl.sum(w[:, None] * acc, axis=0) / tl.sum(w * l, axis=0)
    row = tl.load(q_offsets_ptr + b).to(tl.int64)
    tl.store(out_ptr + row * stride_ot + head * stride_oh + d, out.to(out_ptr.dtype.element_ty), mask=d_mask)


def split_count(n_seqs: int, kv_heads: int, span: int, sms: int, waves: int, min_chunk: int, max_splits: int) -> int:
    """Chunks per (sequence, KV head) for a decode step whose longest visible span is `span` cells:
    enough programs for `waves` per SM, no chunk under `min_chunk` cells, at most `max_splits`
    (SmolLM2 on 132 SMs: 1 x 4096 -> 16 splits, 8 x 2048 -> 8, 32 x 2048 -> 6). The span counts as
    the power of two at or above it, so the split count (a launch's grid) stays the same while a
    decode's context grows inside [2^k, 2^(k+1)): what a CUDA graph captured for that bucket
    (slotserver/model/cuda_graph.py) replays, over strided and paged caches alike; otherwise a
    bucket's floats would follow whichever batch it was captured on (docs/gpu.md, fifteenth session)."""
    want = -(-waves * sms // max(1, n_seqs * kv_heads))
    span = 1 << max(0, span - 1).bit_length()
    return max(1, min(want, -(-span // min_chunk), max_splits))


def decode_partials(out: torch.Tensor, n_seqs: int, n_splits: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A split decode's float32 partials for `combine`: m, l_sum [B, q_heads, splits] and acc
    [B, q_heads, splits, dim]; with one split `out` thrice (pointers the kernel never dereferences)."""
    if n_splits == 1:
        return out, out, out
    q_heads, dim = out.shape[1], out.shape[2]
    m = torch.empty((n_seqs, q_heads, n_splits), dtype=torch.float32, device=out.device)
    return m, torch.empty_like(m), torch.empty((n_seqs, q_heads, n_splits, dim), dtype=torch.float32, device=out.device)


def combine(m: torch.Tensor, l_sum: torch.Tensor, acc: torch.Tensor, out: torch.Tensor, q_offsets: torch.Tensor,
            sinks: torch.Tensor, sinks_on: bool) -> None:
    """`_decode_combine_kernel` over (sequences, query heads): the partials m, l_sum [B, q_heads, splits]
    and acc [B, q_heads, splits, dim] (float32) merged into out's rows at q_offsets."""
    n_seqs, q_heads, n_splits, dim = acc.shape
    _decode_combine_kernel[(n_seqs, q_heads)](
        m, l_sum, acc, out, q_offsets, sinks, n_splits, out.stride(0), out.stride(1), HEAD_DIM=dim,
        BLOCK_S=_triton.next_power_of_2(n_splits), BLOCK_D=_triton.next_power_of_2(dim), SINKS=sinks_on)


def aot_combine(dtype: str, dim: int = 64, splits: int = 16, sinks: bool = False) -> tuple:
    sig = {"m_ptr": "*fp32", "l_ptr": "*fp32", "acc_ptr": "*fp32", "out_ptr": f"*{dtype}", "q_offsets_ptr": "*i64",
           "sinks_ptr": "*fp32" if sinks else "*i64", "n_splits": "i32", "stride_ot": "i32", "stride_oh": "i32"}
    const = {"HEAD_DIM": dim, "BLOCK_S": splits, "BLOCK_D": dim, "SINKS": sinks}
    return (_decode_combine_kernel, sig | {name: "constexpr" for name in const}, const)
