"""kv_store: write new K/V rows into a strided cache, `cache[streams[t], positions[t]] = row[t]`.

The cache is a `StridedKV` view (logical `[stream, cell, kv_head, head_dim]`, any strides, so one
kernel serves `seq_head_dim`, `head_seq_dim` and `q8`). With scales present (int8 cache) each
head's row is quantized on the way in: `scale = max|x| / 127`, `q = floor(x / scale + 0.5)`, the
rounding `layouts/q8.py` uses. The op writes in place and returns the same `StridedKV`; callers
that compare implementations must give each one its own copy of the inputs.
"""

from __future__ import annotations

import torch
import triton as _triton
import triton.language as tl

from slotserver.lab.kv_spec import StridedKV

OP = "kv_store"
TOL = {torch.float32: 1e-6, torch.bfloat16: 1e-6}  # a copy (or the same rounding): exact
QMAX = 127


def _quantize(rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """rows: [..., head_dim] -> int8 [..., head_dim], float32 scale [...] (0 for an all-zero row)."""
    xf = rows.float()
    scale = xf.abs().amax(dim=-1) / QMAX
    inv = torch.where(scale > 0, 1.0 / scale, torch.zeros_like(scale))
    return torch.floor(xf * inv.unsqueeze(-1) + 0.5).clamp(-QMAX, QMAX).to(torch.int8), scale


def reference(kv: StridedKV, streams: torch.Tensor, positions: torch.Tensor,
              k: torch.Tensor, v: torch.Tensor) -> StridedKV:
    """One row at a time: obviously correct."""
    for t in range(streams.shape[0]):
        s, p = int(streams[t]), int(positions[t])
        for cache, scales, rows in ((kv.k, kv.k_scale, k), (kv.v, kv.v_scale, v)):
            if scales is None:
                cache[s, p] = rows[t].to(cache.dtype)
            else:
                cache[s, p], scales[s, p] = _quantize(rows[t])
    return kv


def cpu(kv: StridedKV, streams: torch.Tensor, positions: torch.Tensor,
        k: torch.Tensor, v: torch.Tensor) -> StridedKV:
    for cache, scales, rows in ((kv.k, kv.k_scale, k), (kv.v, kv.v_scale, v)):
        if scales is None:
            cache.index_put_((streams, positions), rows.to(cache.dtype))
        else:
            q, scale = _quantize(rows)
            cache.index_put_((streams, positions), q)
            scales.index_put_((streams, positions), scale)
    return kv


@_triton.jit
def _kv_store_kernel(rows_ptr, cache_ptr, scale_ptr, streams_ptr, positions_ptr,
                     stride_rt, stride_rh, stride_cs, stride_cc, stride_ch,
                     stride_ss, stride_sc, stride_sh, n_heads, head_dim,
                     BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr, QUANT: tl.constexpr):
    """One program per token: its `[heads, head_dim]` row goes to (stream, position) of the cache."""
    t = tl.program_id(0).to(tl.int64)
    s = tl.load(streams_ptr + t).to(tl.int64)
    p = tl.load(positions_ptr + t).to(tl.int64)
    h = tl.arange(0, BLOCK_H)
    d = tl.arange(0, BLOCK_D)
    mask = (h[:, None] < n_heads) & (d[None, :] < head_dim)
    x = tl.load(rows_ptr + t * stride_rt + h[:, None] * stride_rh + d[None, :], mask=mask, other=0.0)
    dst = cache_ptr + s * stride_cs + p * stride_cc + h[:, None] * stride_ch + d[None, :]
    if QUANT:
        xf = x.to(tl.float32)                                      # [BLOCK_H, BLOCK_D]
        scale = tl.max(tl.abs(xf), axis=1) / 127.0                 # [BLOCK_H]
        inv = tl.where(scale > 0, 1.0 / scale, 0.0)
        q = tl.floor(xf * inv[:, None] + 0.5)
        q = tl.minimum(tl.maximum(q, -127.0), 127.0)
        tl.store(dst, q.to(tl.int8), mask=mask)
        tl.store(scale_ptr + s * stride_ss + p * stride_sc + h * stride_sh, scale, mask=h < n_heads)
    else:
        tl.store(dst, x.to(cache_ptr.dtype.element_ty), mask=mask)


def triton(kv: StridedKV, streams: torch.Tensor, positions: torch.Tensor,
           k: torch.Tensor, v: torch.Tensor) -> StridedKV:
    """Same contract as `cpu`: writes `kv` in place, returns it."""
    quant = kv.k_scale is not None
    _check(kv, streams, positions, k, v, quant)
    tokens, heads, dim = k.shape
    if tokens == 0:
        return kv
    meta = dict(BLOCK_H=_triton.next_power_of_2(heads), BLOCK_D=_triton.next_power_of_2(dim), QUANT=quant)
    for cache, scales, rows in ((kv.k, kv.k_scale, k), (kv.v, kv.v_scale, v)):
        sc = scales if quant else cache          # unused pointer when not quantizing
        ss = scales.stride() if quant else (0, 0, 0)
        _kv_store_kernel[(tokens,)](rows, cache, sc, streams, positions, rows.stride(0), rows.stride(1),
                                    cache.stride(0), cache.stride(1), cache.stride(2), *ss, heads, dim, **meta)
    return kv


def _check(kv: StridedKV, streams, positions, k, v, quant: bool) -> None:
    assert k.shape == v.shape and k.dim() == 3, "k, v must be [tokens, kv_heads, head_dim]"
    assert kv.k.dim() == 4 and kv.k.shape == kv.v.shape and kv.k.shape[2:] == k.shape[1:], \
        f"cache {tuple(kv.k.shape)} does not hold rows {tuple(k.shape)}"
    for t in (kv.k, kv.v, k, v):
        assert t.stride(-1) == 1, "head_dim must be the innermost (unit-stride) dim"
    assert streams.shape == positions.shape == (k.shape[0],)
    assert streams.dtype == positions.dtype == torch.int64
    if quant:
        assert kv.k.dtype == kv.v.dtype == torch.int8 and kv.v_scale is not None
        assert kv.k_scale.dtype == kv.v_scale.dtype == torch.float32
        assert kv.k_scale.shape == kv.k.shape[:3] and kv.k_scale.stride() == kv.v_scale.stride()
    else:
        assert kv.k.dtype == kv.v.dtype and kv.k.dtype.is_floating_point


def example_inputs(gen: torch.Generator, dtype: torch.dtype) -> tuple:
    """New rows for distinct cells of a cache that is plain, heads-first (strided) or int8."""
    n_streams, n_cells = 4, 12
    heads, dim = int(torch.randint(1, 5, (), generator=gen)), int(torch.randint(1, 40, (), generator=gen))
    tokens = int(torch.randint(1, 12, (), generator=gen))
    cells = torch.randperm(n_streams * n_cells, generator=gen)[:tokens]
    streams, positions = cells // n_cells, cells % n_cells
    k = torch.randn(tokens, heads, dim, generator=gen).to(dtype)
    v = torch.randn(tokens, heads, dim, generator=gen).to(dtype)
    kind = int(torch.randint(0, 3, (), generator=gen))
    if kind == 2:
        cache = [torch.zeros(n_streams, n_cells, heads, dim, dtype=torch.int8) for _ in range(2)]
        scales = [torch.zeros(n_streams, n_cells, heads) for _ in range(2)]
        return StridedKV(*cache, *scales), streams, positions, k, v
    shape = (n_streams, heads, n_cells, dim) if kind == 1 else (n_streams, n_cells, heads, dim)
    cache = [torch.randn(shape, generator=gen).to(dtype) for _ in range(2)]
    if kind == 1:
        cache = [c.transpose(1, 2) for c in cache]  # head_seq_dim's permuted view
    return StridedKV(*cache), streams, positions, k, v


def _aot(rows: str, cache: str, quant: bool) -> tuple:
    sig = {"rows_ptr": f"*{rows}", "cache_ptr": f"*{cache}", "scale_ptr": "*fp32",
           "streams_ptr": "*i64", "positions_ptr": "*i64",
           **{n: "i32" for n in ("stride_rt", "stride_rh", "stride_cs", "stride_cc", "stride_ch",
                                 "stride_ss", "stride_sc", "stride_sh", "n_heads", "head_dim")},
           "BLOCK_H": "constexpr", "BLOCK_D": "constexpr", "QUANT": "constexpr"}
    return (_kv_store_kernel, sig, {"BLOCK_H": 4, "BLOCK_D": 64, "QUANT": quant})


AOT = [_aot("bf16", "bf16", False), _aot("bf16", "i8", True)]
