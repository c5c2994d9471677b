"""paged_attention: causal attention of a ragged batch against a paged KV cache (vLLM style).

Same maths as `attention.py`; the KV comes as pages plus a block table (`PagedKV`): cell `c` of
stream `s` is row `c % block_size` of page `block_table[s, c // block_size]`. Pages are logical
`[n_blocks, block_size, kv_head, head_dim]` views with any strides (`paged` stores tokens before
heads, `paged_hnd` heads before tokens). Only the blocks covering `max_kv` are read (cpu) or each
sequence's own `kv_len` cells (triton). A layer's sliding window and softcap come in `AttnMeta`
(see attention.py): the cpu path gathers from the block of the earliest cell any query sees, the
triton kernels start their loops at each sequence's (tile's) first visible cell.

`cpu(...)` runs every query row through attention.py's C kernel (kernels/attention.c, compiled
from the same file) reading the cells through the block table: a paged layout and a flat one
holding the same element type give the same floats, so a live layout swap changes no answer
(issue 32: through SDPA on bf16 the paged layouts had moved the default model's log-probabilities
by 0.1-0.2). Where the C kernel does not apply (no compiler) the gather + SDPA form serves.
The Triton kernels' code lives in parts (runtime/kernel_parts.py): _paged_attention_kernels.py
and _attention_tl.py (the helpers and the decode merge, shared with attention); the launches are here.
"""

from __future__ import annotations

import math

import torch
import triton as _triton

from slotserver.runtime.gpu_info import sm_count
from slotserver.runtime import kernel_parts, lazy_triton, native
from slotserver.runtime.batch import AttnMeta, Batch, SeqChunk, softmax_sinks
from slotserver.runtime.kv_spec import PagedKV

_kernels = kernel_parts.load(__file__, "_paged_attention_kernels.py")   # the Triton kernels (jit code); launched below
_tl = kernel_parts.load(__file__, "_attention_tl.py")    # the split count, partials and merge, shared with attention
_sdpa = kernel_parts.load(__file__, "_attention_sdpa.py")   # attention's torch SDPA helpers (band, sdpa), example draws
_native = kernel_parts.load(__file__, "_attention_native.py")   # the C kernel's limits and `spread` (its _LIB is ours)
_paged_decode_kernel, _paged_prefill_kernel = _kernels._paged_decode_kernel, _kernels._paged_prefill_kernel


OP = "paged_attention"
# AttnMeta's per-layer options beyond window and softcap that every implementation honours (FUSES, as
# kernels/qmatmul.py's): a model with sinks (gpt-oss) refuses at load a lab copy from before them,
# which would ignore them silently.
FUSES = ("sinks",)
TOL = {torch.float32: 1e-4, torch.bfloat16: 3e-2}
LOG2E = 1.4426950408889634
# Decode (flash-decoding), as in attention.py: grid (sequences, KV heads, splits), one chunk of a
# sequence's cells per program in [DECODE_BLOCK_N, head_dim] tiles, then a small combine kernel.
DECODE_BLOCK_N = 64        # cells per K/V tile (a power of two >= 16; may span several pages)
DECODE_MIN_CHUNK = 256     # no chunk shorter than this many cells (tests lower it to force splits)
DECODE_MAX_SPLITS = 64
DECODE_WAVES = 4           # programs wanted: this many per SM
DECODE_DOT_MIN_GROUP = 2   # GQA groups from this size use tl.dot, padded to 16 rows; smaller ones the broadcast form
DECODE_WARPS = 4
DECODE_STAGES = 3          # software-pipelined K/V tile loads (cp.async on sm_80+)
DECODE_FORCE_SPLITS: int | None = None   # a fixed number of splits (tests, benchmarks); None: decode_splits
DEFAULT_SMS = 132          # the SM count assumed off a GPU (the interpreter): an H100 SXM
# The prefill's tiles per head size: _attention_tl.py's PREFILL16* (both ops read them).
prefill_tiles = _tl.prefill_tiles


def reference(q: torch.Tensor, kv: PagedKV, meta: AttnMeta, scale: float) -> torch.Tensor:
    """q: [tokens, q_heads, head_dim] -> like q. Per sequence, per query, in float32: slow, plain."""
    out = torch.empty(q.shape, dtype=torch.float32, device=q.device)
    group, window, softcap = q.shape[1] // kv.k_pages.shape[2], meta.window, meta.softcap
    for b in range(meta.n_seqs):
        stream, n_q, n_kv = (int(meta.seq_streams[b]), int(meta.q_lens[b]), int(meta.kv_lens[b]))
        cells = torch.arange(n_kv, device=q.device)
        blocks = kv.block_table[stream, cells // kv.block_size].long()
        keys = kv.k_pages[blocks, cells % kv.block_size].float().repeat_interleave(group, dim=1)
        vals = kv.v_pages[blocks, cells % kv.block_size].float().repeat_interleave(group, dim=1)
        for j in range(n_q):
            row, pos = int(meta.q_offsets[b]) + j, n_kv - n_q + j
            lo = max(0, pos - window + 1) if window else 0
            scores = torch.einsum("hd,khd->hk", q[row].float(), keys[lo: pos + 1]) * scale
            if softcap:
                scores = softcap * torch.tanh(scores / softcap)
            out[row] = torch.einsum("hk,khd->hd", softmax_sinks(scores, meta.sinks), vals[lo: pos + 1])
    return out.to(q.dtype)


def cpu(q: torch.Tensor, kv: PagedKV, meta: AttnMeta, scale: float) -> torch.Tensor:
    """Same contract as `reference`: the C row kernel where it applies, else `_cpu_sdpa`."""
    wide = _native.spread(q.shape[1], kv)   # more than 16 query heads on one KV head: units of 16
    if _native_ok(q, wide, meta):
        return _native_rows(q, wide, meta, scale)
    return _cpu_sdpa(q, kv, meta, scale)


# attention.py's C (one file, one library): `paged_attention_rows` is its block-table entry
NATIVE_C = native.joined(__file__, [("attention_amx_kv.c", native.c_source(__file__, "attention_amx_kv.c")),
                                     ("attention_amx.c", native.c_source(__file__, "attention_amx.c")),
                                     ("attention.c", native.c_source(__file__, "attention.c"))])
_LIB = native.build("attention", NATIVE_C, strict=True)
native.signature(_LIB, "attention_prompt_amx", 0, 0)
native.signature(_LIB, "paged_attention_rows", 9, 15, (native.ctypes.c_float, native.ctypes.c_float,
                                                       native.ctypes.c_int, native.ctypes.c_int, native.ctypes.c_int))
_KV_TYPES = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}


def cpu_path() -> str:
    """What `cpu` computes with here (shown in /props, /lab and `slotserver top`)."""
    if _LIB is None:
        return "torch SDPA"
    amx = _LIB.attention_prompt_amx() == 1
    return "C row kernel, float32" + ("; prompt rows of f16/bf16 caches: AMX bf16 hi+lo tiles" if amx else "")


def _native_ok(q: torch.Tensor, kv: PagedKV, meta: AttnMeta) -> bool:
    """The C kernel reads raw memory: CPU float pages with a unit head_dim stride, an int32 table
    with unit column stride covering every sequence's cells, q of f32/bf16, int64 row metadata."""
    k, v, table, streams, lens = kv.k_pages, kv.v_pages, kv.block_table, meta.row_streams, meta.row_kv_lens
    if _LIB is None or streams is None or lens is None or not (q.is_cpu and k.is_cpu and table.is_cpu):
        return False
    if q.dtype not in (torch.float32, torch.bfloat16) or k.dtype != v.dtype or k.dtype not in _KV_TYPES:
        return False
    ks, qs, bs = k.shape, q.shape, kv.block_size
    if len(qs) != 3 or len(ks) != 4 or v.shape != ks or ks[1] != bs or bs & (bs - 1) or ks[3] != qs[2] \
            or qs[2] > _native.DMAX or qs[1] % ks[2] or qs[1] // ks[2] > _native.GMAX or qs[0] != streams.shape[0]:
        return False
    if q.stride(2) != 1 or k.stride(3) != 1 or v.stride(3) != 1 or table.dtype != torch.int32 \
            or table.dim() != 2 or table.stride(1) != 1 or streams.dtype != torch.int64 or lens.dtype != torch.int64 \
            or not (streams.is_contiguous() and lens.is_contiguous()):
        return False
    # the streams' range as attention.py finds it: no tensor read when the batch's streams are contiguous
    sinks = meta.sinks
    if sinks is not None and not (sinks.dtype == torch.float32 and sinks.shape == (qs[1],) and sinks.is_contiguous()
                                  and sinks.is_cpu):
        return False
    top = meta.stream_base + meta.n_seqs if meta.stream_base is not None else int(meta.seq_streams.max()) + 1
    return meta.max_kv <= table.shape[1] * bs and top <= table.shape[0]


def _native_rows(q: torch.Tensor, kv: PagedKV, meta: AttnMeta, scale: float) -> torch.Tensor:
    """Every row of q as one decode query over its stream's first row_kv_lens cells, via the table."""
    n_rows, q_heads, dim = q.shape
    k, v = kv.k_pages, kv.v_pages
    out = torch.empty((n_rows, q_heads, dim), dtype=q.dtype)                        # [tokens, q_heads, dim]
    rc = _LIB.paged_attention_rows(
        q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(), meta.row_streams.data_ptr(),
        meta.row_kv_lens.data_ptr(), _prompt_ptr(meta), kv.block_table.data_ptr(),
        0 if meta.sinks is None else meta.sinks.data_ptr(), n_rows, q_heads, k.shape[2], dim,
        q.stride(0), q.stride(1), *k.stride()[:3], *v.stride()[:3], kv.block_table.stride(0),
        kv.block_size.bit_length() - 1, meta.window, scale, meta.softcap, native.is_bf16(q), _KV_TYPES[k.dtype],
        torch.get_num_threads())
    if rc != 0:
        raise RuntimeError(f"paged_attention_rows (C) failed with {rc}: unsupported group or head_dim")
    return out


def _prompt_ptr(meta: AttnMeta) -> int:
    """The rows' prompt flags for the C (0: none; see attention.py's `_native_rows`)."""
    return 0 if meta.row_prompt is None else meta.row_prompt.data_ptr()


def _cpu_sdpa(q: torch.Tensor, kv: PagedKV, meta: AttnMeta, scale: float) -> torch.Tensor:
    """Gather the batch's blocks covering `lo .. max_kv-1` to `[B, kv_heads, L, dim]` (lo: the first
    block any query sees; 0 without a window), then SDPA as in attention.py: decode rows unpadded
    (GQA group as the query axis), a mixed step split in two."""
    if meta.split is not None:  # decodes first, then prefill chunks: never pad a decode row
        dec, pre = meta.split
        return torch.cat([_cpu_sdpa(q[: dec.n_seqs], kv, dec, scale), _cpu_sdpa(q[dec.n_seqs:], kv, pre, scale)])
    n_seq, max_q, max_kv, window = meta.n_seqs, meta.max_q, meta.max_kv, meta.window
    q_heads, dim, bs = q.shape[1], q.shape[2], kv.block_size
    first = max(0, int((meta.kv_lens - meta.q_lens).min()) - window + 1) if window else 0
    b0 = first // bs
    table = kv.block_table[meta.seq_streams, b0: -(-max_kv // bs)].long().clamp(min=0)
    keys, vals = (_gather(pages, table, max_kv - b0 * bs, q.dtype) for pages in (kv.k_pages, kv.v_pages))
    key_pos = torch.arange(b0 * bs, max_kv, device=q.device)           # [L]
    if max_q == 1:                                                      # decode: q [B, q_heads, 1, dim]
        mask = _sdpa.band(key_pos, meta.kv_lens.view(n_seq, 1) - 1, window).view(n_seq, 1, 1, -1)
        out = _sdpa.sdpa(q.reshape(n_seq, q_heads, 1, dim), keys, vals, mask, scale, meta.softcap, sinks=meta.sinks)
        return out.view(n_seq, q_heads, dim)
    qp = q[meta.pad_index].transpose(1, 2)                              # [B, q_heads, max_q, dim]
    mask = _sdpa.band(key_pos.view(1, 1, 1, -1), meta.pad_positions.view(n_seq, 1, max_q, 1), window)  # [B, 1, max_q, L]
    out = _sdpa.sdpa(qp, keys, vals, mask, scale, meta.softcap, sinks=meta.sinks)
    return out.transpose(1, 2).reshape(n_seq * max_q, q_heads, dim)[meta.valid_rows]  # [tokens, q_heads, dim]


def _gather(pages: torch.Tensor, table: torch.Tensor, max_kv: int, dtype: torch.dtype) -> torch.Tensor:
    """pages [n_blocks, bs, kv_heads, dim], table [B, nb] -> [B, kv_heads, max_kv, dim] (the first
    max_kv cells of the blocks the table lists)."""
    n_seq, nb = table.shape
    x = pages[table]                                                    # [B, nb, bs, kv_heads, dim]
    x = x.reshape(n_seq, nb * pages.shape[1], pages.shape[2], pages.shape[3])[:, :max_kv]
    return x.transpose(1, 2).to(dtype)


def triton(q: torch.Tensor, kv: PagedKV, meta: AttnMeta, scale: float) -> torch.Tensor:
    """Same contract as `cpu`; decode kernel when `meta.max_q == 1`, causal prefill kernel otherwise."""
    _check(q, kv, meta)
    kv_heads, dim = kv.k_pages.shape[2], q.shape[2]
    group = q.shape[1] // kv_heads
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    sinks = meta.kv_lens if meta.sinks is None else meta.sinks.to(device=q.device, dtype=torch.float32).contiguous()
    args = (sinks, q.stride(0), q.stride(1), *kv.k_pages.stride()[:3], *kv.v_pages.stride()[:3],
            kv.block_table.stride(0), out.stride(0), out.stride(1), scale * LOG2E, meta.window,
            float(meta.softcap or 1.0))
    common = dict(GROUP=group, HEAD_DIM=dim, PAGE=kv.block_size, SOFTCAP=bool(meta.softcap),
                  SINKS=meta.sinks is not None)
    if meta.max_q == 1:
        _decode(q, kv, meta, out, args, group)
    else:
        tiles = prefill_tiles(q.dtype, dim)
        grid = (meta.n_seqs, kv_heads, _triton.cdiv(meta.max_q * group, tiles["BLOCK_M"]))
        _paged_prefill_kernel[grid](
            q, kv.k_pages, kv.v_pages, out, kv.block_table, meta.seq_streams, meta.q_lens, meta.kv_lens,
            meta.q_offsets, *args, **common, BLOCK_D=max(16, _triton.next_power_of_2(dim)),
            IEEE_DOT=q.dtype == torch.float32 or _interpreted(), **tiles)
    return out


def decode_splits(n_seqs: int, kv_heads: int, span: int, device: torch.device) -> int:
    """As attention.py's: _attention_tl.py's `split_count` over this module's DECODE_* constants
    (constant inside a power-of-two bucket of spans, for CUDA graphs); DECODE_FORCE_SPLITS: fixed."""
    if DECODE_FORCE_SPLITS:
        return max(1, int(DECODE_FORCE_SPLITS))
    return _tl.split_count(n_seqs, kv_heads, span, sm_count(device, DEFAULT_SMS), DECODE_WAVES, DECODE_MIN_CHUNK,
                           DECODE_MAX_SPLITS)


def _decode(q: torch.Tensor, kv: PagedKV, meta: AttnMeta, out: torch.Tensor, args: tuple, group: int) -> None:
    """One query per sequence: `_paged_decode_kernel` over (sequences, KV heads, splits), then with
    several splits `_tl.combine` over (sequences, query heads)."""
    n_seqs, q_heads, dim = meta.n_seqs, q.shape[1], q.shape[2]
    kv_heads = q_heads // group
    span = min(meta.max_kv, meta.window) if meta.window else meta.max_kv
    n_splits = decode_splits(n_seqs, kv_heads, span, q.device)
    dot = group >= DECODE_DOT_MIN_GROUP
    m, l_sum, acc = _tl.decode_partials(out, n_seqs, n_splits)
    _paged_decode_kernel[(n_seqs, kv_heads, n_splits)](
        q, kv.k_pages, kv.v_pages, out, m, l_sum, acc, kv.block_table, meta.seq_streams, meta.kv_lens,
        meta.q_offsets, *args, GROUP=group, HEAD_DIM=dim, PAGE=kv.block_size,
        BLOCK_G=max(16 if dot else 1, _triton.next_power_of_2(group)), BLOCK_D=max(16, _triton.next_power_of_2(dim)),
        BLOCK_N=DECODE_BLOCK_N, SOFTCAP=bool(meta.softcap), DOT=dot,
        IEEE_DOT=q.dtype == torch.float32 or _interpreted(), SPLIT=n_splits > 1, SINKS=meta.sinks is not None,
        SAME_KV=kv.k_pages.stride() == kv.v_pages.stride(), num_warps=DECODE_WARPS, num_stages=DECODE_STAGES)
    if n_splits > 1:
        _tl.combine(m, l_sum, acc, out, meta.q_offsets, args[0], meta.sinks is not None)


def _interpreted() -> bool:
    """True when triton was imported with TRITON_INTERPRET=1 (kernels run on CPU tensors). `resolve`:
    before this module's first launch its kernels are lazy_triton's stand-ins, whose type says
    nothing (that first launch then took the bf16 dot the interpreter multiplies as bit patterns)."""
    return type(lazy_triton.resolve(_paged_prefill_kernel)).__name__ == "InterpretedFunction"


def _check(q: torch.Tensor, kv: PagedKV, meta: AttnMeta) -> None:
    assert q.dim() == 3 and q.stride(2) == 1, f"q must be [tokens, q_heads, head_dim], unit last stride: {q.stride()}"
    assert kv.k_pages.dim() == 4 and kv.k_pages.shape == kv.v_pages.shape
    assert kv.k_pages.shape[1] == kv.block_size, "pages must be [n_blocks, block_size, kv_heads, head_dim]"
    assert kv.block_size & (kv.block_size - 1) == 0, "block_size must be a power of two"
    assert kv.k_pages.shape[3] == q.shape[2] and q.shape[1] % kv.k_pages.shape[2] == 0
    assert kv.k_pages.stride(3) == 1 and kv.v_pages.stride(3) == 1, "head_dim must be innermost"
    assert kv.k_pages.dtype == kv.v_pages.dtype and kv.k_pages.dtype in (q.dtype, torch.float16), \
        f"pages {kv.k_pages.dtype} must match q {q.dtype} or be float16"
    assert kv.block_table.dim() == 2 and kv.block_table.stride(1) == 1
    assert kv.block_table.dtype in (torch.int32, torch.int64) and kv.block_table.device == q.device
    for t in (meta.seq_streams, meta.q_lens, meta.kv_lens, meta.q_offsets):
        assert t.dtype == torch.int64 and t.is_contiguous() and t.device == q.device


def example_inputs(gen: torch.Generator, dtype: torch.dtype) -> tuple:
    """A random ragged batch over shuffled pages (block size 4, 8 or 16; tokens- or heads-first
    storage); table entries past each sequence's length are unmapped (-1)."""
    kv_heads, group = int(torch.randint(1, 4, (), generator=gen)), int(torch.randint(1, 4, (), generator=gen))
    dim, block_size = _sdpa.example_dim(gen), 2 ** int(torch.randint(2, 5, (), generator=gen))
    n_streams, n_cells = 5, 40
    per_stream = -(-n_cells // block_size)
    n_blocks = n_streams * per_stream + 2
    decode_only = bool(torch.rand((), generator=gen) < 0.3)
    chunks = []
    for s in torch.randperm(n_streams, generator=gen)[: int(torch.randint(1, n_streams + 1, (), generator=gen))].tolist():
        n_new = 1 if decode_only or torch.rand((), generator=gen) < 0.5 else int(torch.randint(1, 10, (), generator=gen))
        prompt = n_new > 1 and bool(torch.rand((), generator=gen) < 0.5)   # AMX rows, where the CPU has it
        chunks.append(SeqChunk(stream=s, start=int(torch.randint(0, 30, (), generator=gen)), tokens=[0] * n_new,
                               prompt=prompt))
    if torch.rand((), generator=gen) < 0.5:  # the engine's order, decodes first (AttnMeta.split)
        chunks.sort(key=lambda c: len(c.tokens) > 1)
    meta = _sdpa.example_layer(Batch.build(chunks).attn, gen, kv_heads * group)
    owned = torch.randperm(n_blocks, generator=gen)[: n_streams * per_stream].view(n_streams, per_stream)
    table = torch.full((n_streams, per_stream), -1, dtype=torch.int32)
    for s, n_kv in zip(meta.seq_streams.tolist(), meta.kv_lens.tolist()):
        table[s, : -(-n_kv // block_size)] = owned[s, : -(-n_kv // block_size)].int()
    heads_first = bool(torch.rand((), generator=gen) < 0.5)
    shape = (n_blocks, kv_heads, block_size, dim) if heads_first else (n_blocks, block_size, kv_heads, dim)
    cache = torch.float16 if torch.rand((), generator=gen) < 0.25 else dtype   # f16: the serving default cache type
    k, v = (torch.randn(shape, generator=gen).to(cache) for _ in range(2))
    if heads_first:
        k, v = k.transpose(1, 2), v.transpose(1, 2)
    # q as the model passes it: the query heads of the roped q|k rows (a strided view)
    q = torch.randn(int(meta.q_lens.sum()), kv_heads * (group + 1), dim, generator=gen).to(dtype)[:, : kv_heads * group]
    return q, PagedKV(k, v, table, block_size), meta, 1 / math.sqrt(dim)


def _aot(dtype: str, decode: bool, group: int = 3, dim: int = 64, page: int = 16, cache: str | None = None,
         split: bool = True, sinks: bool = False) -> tuple:
    cache = cache or dtype
    sig = {"q_ptr": f"*{dtype}", "k_ptr": f"*{cache}", "v_ptr": f"*{cache}", "out_ptr": f"*{dtype}"}
    sig |= {"m_ptr": "*fp32", "l_ptr": "*fp32", "acc_ptr": "*fp32"} if decode else {}
    sig |= {"table_ptr": "*i32", "streams_ptr": "*i64"}
    sig |= {"kv_lens_ptr": "*i64"} if decode else {"q_lens_ptr": "*i64", "kv_lens_ptr": "*i64"}
    sig |= {"q_offsets_ptr": "*i64", "sinks_ptr": "*fp32" if sinks else "*i64"}   # no sinks: kv_lens, unread
    sig |= {n: "i32" for n in ("stride_qt", "stride_qh", "stride_kb", "stride_kr", "stride_kh", "stride_vb",
                               "stride_vr", "stride_vh", "stride_bt", "stride_ot", "stride_oh")}
    sig |= {"qk_scale": "fp32", "window": "i32", "softcap": "fp32"}
    pow2 = lambda n: 1 << (n - 1).bit_length()   # noqa: E731 - triton.next_power_of_2, without importing triton here
    const = {"GROUP": group, "HEAD_DIM": dim, "PAGE": page, "BLOCK_D": max(16, pow2(dim)), "SOFTCAP": False,
             "SINKS": sinks}
    if decode:
        dot = group >= DECODE_DOT_MIN_GROUP
        const |= {"BLOCK_G": max(16 if dot else 1, pow2(group)), "BLOCK_N": DECODE_BLOCK_N, "DOT": dot,
                  "IEEE_DOT": dtype == "fp32", "SPLIT": split, "SAME_KV": True}
    elif dtype == "fp32":
        tiles = prefill_tiles(torch.float32, dim)
        const |= {"BLOCK_M": tiles["BLOCK_M"], "BLOCK_N": tiles["BLOCK_N"], "IEEE_DOT": True}
    else:   # the 16-bit tiles, with their warps, stages and the alignment the JIT sees, as served
        tiles = prefill_tiles(torch.bfloat16, dim)
        const |= {"BLOCK_M": tiles["BLOCK_M"], "BLOCK_N": tiles["BLOCK_N"], "IEEE_DOT": False}
        sig |= {name: "constexpr" for name in const}
        aligned = ("q_ptr", "k_ptr", "v_ptr", "out_ptr", "stride_qt", "stride_qh", "stride_kb", "stride_kr",
                   "stride_kh", "stride_vb", "stride_vr", "stride_vh", "stride_ot", "stride_oh")
        return (_paged_prefill_kernel, sig, const, {k: tiles[k] for k in ("num_warps", "num_stages")}
                | {"aligned": aligned})
    sig |= {name: "constexpr" for name in const}
    if decode:   # its launch options and alignment as it serves (without them ptxas reports spills it never has)
        aligned = ("q_ptr", "k_ptr", "v_ptr", "out_ptr", "m_ptr", "l_ptr", "acc_ptr", "stride_qt", "stride_qh",
                   "stride_kb", "stride_kr", "stride_kh", "stride_vb", "stride_vr", "stride_vh", "stride_ot", "stride_oh")
        return (_paged_decode_kernel, sig, const, {"num_warps": DECODE_WARPS, "num_stages": DECODE_STAGES,
                                                   "aligned": aligned})
    return (_paged_prefill_kernel, sig, const)


# SmolLM2-135M geometry (group 3, head_dim 64, 16-cell pages): bf16 and f16 pages, decode (split
# and not) and prefill; Llama-3-8B's decode and prefill (group 4, head_dim 128); the decode combine.
AOT = [_aot("bf16", True), _aot("bf16", True, cache="fp16"), _aot("bf16", True, split=False),
       _aot("bf16", True, group=4, dim=128), _aot("bf16", False), _aot("fp32", True), _tl.aot_combine("bf16"),
       _aot("bf16", True, group=8, cache="fp16", sinks=True),   # gpt-oss-20b's decode (group 8, sinks)
       _aot("bf16", False, group=4, dim=128), _aot("bf16", False, group=2, dim=256)]   # Llama-3-8B's, gemma2's prefill
