"""attention's C row kernel (kernels/attention.c with attention_amx_kv.c and attention_amx.c in front of
it, one library shared with paged_attention): the build, whether a step's inputs fit it (`fits`) and
the call (`rows`). attention.py keeps `NATIVE_C` and `_LIB` as its own names (the native contract:
a test sets `_LIB = None` on the module for the torch form) and passes its `_LIB` in.
A part of attention.py (runtime/kernel_parts.py).
"""

from __future__ import annotations

import torch

from slotserver.runtime import native
from slotserver.runtime.batch import AttnMeta
from slotserver.runtime.kv_spec import StridedKV

# The row kernel in C (kernels/attention.c, shared with paged_attention.py: compiled on first use
# by `slotserver.runtime.native`; without a C compiler the torch forms serve: _attention_sdpa.py).
NATIVE_C = native.joined(__file__, [("attention_amx_kv.c", native.c_source(__file__, "attention_amx_kv.c")),
                                     ("attention_amx.c", native.c_source(__file__, "attention_amx.c")),
                                     ("attention.c", native.c_source(__file__, "attention.c"))])
_LIB = native.build("attention", NATIVE_C, strict=True)
native.signature(_LIB, "attention_prompt_amx", 0, 0)
native.signature(_LIB, "decode_attention", 9, 16, (native.ctypes.c_float, native.ctypes.c_float, native.ctypes.c_int,
                                                   native.ctypes.c_int, native.ctypes.c_int), replay=True)
native.signature(_LIB, "prompt_attention", 8, 13, (native.ctypes.c_float, native.ctypes.c_float, native.ctypes.c_int,
                                                   native.ctypes.c_int, native.ctypes.c_int))
_KV_TYPES = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2, torch.int8: 3}   # int8: q8, with its scales
_Q_TYPES = (torch.float32, torch.bfloat16)
GMAX, DMAX = 16, 576   # attention.c's: query heads of one KV head in a work unit, the widest head (deepseek2's row)


def spread(q_heads: int, kv):
    """A cache view (`StridedKV`, or `PagedKV`) with one KV head seen as several KV heads that all
    read its row (stride 0 on the head dim of K/V and of q8's scales), where more than GMAX query
    heads share it, or more than GMAX / 2 of rows past 256 (deepseek2's latent attention: every query
    head, 16-128 of them). The C kernel then runs them in units of at most GMAX query heads and at
    least two units, each its own thread's work (a decode row of 16 heads 576 wide in one unit left a
    core idle: 444 against 265 us in two; 64 wide, two units cost more than they gave: 42 against 36
    us): every query vector's sum is its own, so the floats are those of one unit of all. Any other
    view comes back as it is (the same object: every layer of every step asks)."""
    k = kv[0]
    if k.shape[2] != 1 or q_heads <= (GMAX // 2 if k.shape[3] > 256 else GMAX):
        return kv
    group = max(g for g in range(1, min(GMAX, q_heads // 2) + 1) if q_heads % g == 0)
    n = q_heads // group
    return type(kv)(*(t.expand(*t.shape[:2], n, *t.shape[3:]) if isinstance(t, torch.Tensor) and t.dim() >= 3
                      and t.shape[2] == 1 else t for t in kv))


def cpu_path(lib) -> str:
    """What `cpu` computes with here (shown in /props, /lab and `slotserver top`)."""
    if lib is None:
        return "torch SDPA"
    amx = lib.attention_prompt_amx() == 1
    return "C row kernel, float32" + ("; prompt rows of f16/bf16 caches: AMX bf16 hi+lo tiles" if amx else "")


def fits(q: torch.Tensor, kv: StridedKV, meta: AttnMeta) -> bool:
    """The C kernel reads raw memory: float CPU caches, or int8 ones with float32 scales of one
    stride set (q8), of q's head size, unit head_dim strides, int64 per-row metadata
    (`meta.row_streams`, `meta.row_kv_lens`) of q's rows, and streams that exist. (Ordered and
    written for a decode step's ~30 calls.)"""
    seq_streams, kv_lens, k, v = meta.row_streams, meta.row_kv_lens, kv.k, kv.v
    if seq_streams is None or kv_lens is None or (kv.k_scale is None) != (k.dtype != torch.int8):
        return False
    if kv.k_scale is not None and not _scales_ok(kv):
        return False
    qs, ks = q.shape, k.shape
    if len(qs) != 3 or len(ks) != 4 or v.shape != ks or ks[3] != qs[2] or qs[0] != seq_streams.shape[0] \
            or qs[2] > DMAX or qs[1] % ks[2] or qs[1] // ks[2] > GMAX or meta.max_kv > ks[1]:
        return False
    if q.dtype not in _Q_TYPES or k.dtype != v.dtype or k.dtype not in _KV_TYPES \
            or seq_streams.dtype != torch.int64 or kv_lens.dtype != torch.int64:
        return False
    if q.stride(2) != 1 or k.stride(3) != 1 or v.stride(3) != 1 or not seq_streams.is_contiguous() \
            or not kv_lens.is_contiguous() or not (q.is_cpu and k.is_cpu and v.is_cpu and seq_streams.is_cpu
                                                   and kv_lens.is_cpu):
        return False
    if meta.sinks is not None and not _sinks_ok(meta.sinks, qs[1]):
        return False
    top = meta.stream_base + meta.n_seqs if meta.stream_base is not None else int(meta.seq_streams.max()) + 1
    return top <= ks[0]


def _sinks_ok(sinks: torch.Tensor, q_heads: int) -> bool:
    """Sinks the C reads: float32 [q_heads], contiguous, on the CPU."""
    return sinks.dtype == torch.float32 and sinks.shape == (q_heads,) and sinks.is_contiguous() and sinks.is_cpu


def _scales_ok(kv: StridedKV) -> bool:
    """q8's scales: float32 [streams, cells, kv_heads] on the CPU, K's and V's with one stride set."""
    ks, vs = kv.k_scale, kv.v_scale
    return (vs is not None and ks.dtype == vs.dtype == torch.float32 and ks.shape == vs.shape == kv.k.shape[:3]
            and ks.stride() == vs.stride() and ks.is_cpu and vs.is_cpu)


def rows(lib, q: torch.Tensor, kv: StridedKV, meta: AttnMeta, scale: float, window: int = 0,
                 softcap: float = 0.0) -> torch.Tensor:
    """Every flat row of q as one decode query over its stream's first row_kv_lens cells."""
    n_seq, q_heads, dim = q.shape
    streams, kv_lens = meta.row_streams, meta.row_kv_lens
    out = torch.empty((n_seq, q_heads, dim), dtype=q.dtype)                        # [tokens, q_heads, dim]
    quant = kv.k_scale is not None                                                 # q8: int8 + scales
    sinks = 0 if meta.sinks is None else meta.sinks.data_ptr()                     # NULL: no sinks
    if meta.row_prompt is not None and not quant:   # prompt rows: AMX where the C has it (attention_amx.c)
        rc = lib.prompt_attention(
            q.data_ptr(), kv.k.data_ptr(), kv.v.data_ptr(), out.data_ptr(), streams.data_ptr(), kv_lens.data_ptr(),
            meta.row_prompt.data_ptr(), sinks, n_seq, q_heads, kv.k.shape[2], dim, q.stride(0), q.stride(1),
            *kv.k.stride()[:3], *kv.v.stride()[:3], window, scale, softcap, native.is_bf16(q),
            _KV_TYPES[kv.k.dtype], torch.get_num_threads())
        if rc != 0:
            raise RuntimeError(f"prompt_attention (C) failed with {rc}")
        return out
    rc = lib.decode_attention(
        q.data_ptr(), kv.k.data_ptr(), kv.v.data_ptr(), out.data_ptr(), streams.data_ptr(), kv_lens.data_ptr(),
        kv.k_scale.data_ptr() if quant else 0, kv.v_scale.data_ptr() if quant else 0, sinks,
        n_seq, q_heads, kv.k.shape[2], dim, q.stride(0), q.stride(1), *kv.k.stride()[:3], *kv.v.stride()[:3],
        *(kv.k_scale.stride() if quant else (0, 0, 0)), window, scale, softcap, native.is_bf16(q),
        _KV_TYPES[kv.k.dtype], torch.get_num_threads())
    if rc != 0:
        raise RuntimeError(f"decode_attention (C) failed with {rc}: unsupported group or head_dim")
    return out
