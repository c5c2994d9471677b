"""attention: causal attention of a ragged batch of query chunks against a strided KV cache.

Covers decode (one query per sequence) and (chunked) prefill (many). The KV comes as logical
`[stream, cell, kv_head, head_dim]` views (any strides, see `StridedKV`); GQA never repeats K/V.
`cpu(...)` runs every query row, prefill rows included, through the C row kernel (its part
_attention_native.py) where it applies: row r of a sequence is the one-query computation over its
keys 0..pos, so its result does not depend on how the prompt was split into chunks, cached or
batched with others (llama.cpp's CPU attention has the same property, and its server tests rely
on it: greedy output with and without a cached prompt must agree). The C reads float32, bf16 and
float16 caches, and q8's int8 ones with their scales (value = q * scale, as the reference
dequantizes). Without a compiler the cheapest torch SDPA formulation of each step serves (its part
_attention_sdpa.py, docs/performance.md).

`triton(...)` (the CUDA path) launches a decode kernel when every sequence has one new token
(`meta.max_q == 1`) and a causal prefill-chunk kernel otherwise; both take the view's strides
(plain, heads-first and q8 views alike) and bound their KV loop by each sequence's own length.
Decode is flash-decoding (issue 34): each sequence's cells are split into chunks over a third grid
axis so that even batch 1 fills the GPU (`decode_splits`), and a small kernel merges the chunks. The Triton
kernels' code lives in this module's parts (runtime/kernel_parts.py): _attention_kernels.py, and
_attention_tl.py (the helpers and the merge, shared with paged_attention); the launches are here.

Three per-layer options every implementation reads from `AttnMeta`: `window` (sliding-window
attention, gemma2/3: the query at position p sees keys p-window+1 .. p; 0 is full causal attention),
`softcap` (gemma2: scores -> softcap * tanh(scores / softcap); 0 is off) and `sinks` (gpt-oss: one
learned logit per query head joining every softmax denominator with no value, ggml_soft_max_ext's
sinks; None is off). The reference masks plainly; the CPU and Triton paths never touch the cells
before a window: their KV ranges start at its first cell. A sink changes only the normalisation, so
the kernels apply it where they divide by the softmax sum, once per query: with the row's running
max m and sum l, M = max(m, sink) and out = acc e^(m-M) / (l e^(m-M) + e^(sink-M)) (ggml takes the
max with the sink too). Without sinks the code path and its floats are unchanged.
"""

from __future__ import annotations

import math

import torch
import triton as _triton

from slotserver.runtime import kernel_parts, lazy_triton
from slotserver.runtime.gpu_info import sm_count
from slotserver.runtime.batch import AttnMeta, Batch, SeqChunk, softmax_sinks
from slotserver.runtime.kv_spec import StridedKV

_kernels = kernel_parts.load(__file__, "_attention_kernels.py")   # the Triton kernels (jit code); launched below
_tl = kernel_parts.load(__file__, "_attention_tl.py")    # split count, partials, merge: shared with paged_attention
_sdpa = kernel_parts.load(__file__, "_attention_sdpa.py")   # torch forms (no C), example draws: shared with paged_attention
_native = kernel_parts.load(__file__, "_attention_native.py")   # the C row kernel
NATIVE_C, _LIB = _native.NATIVE_C, _native._LIB   # the native contract's names (tests set _LIB = None)
_attn_decode_kernel, _attn_prefill_kernel = _kernels._attn_decode_kernel, _kernels._attn_prefill_kernel

OP = "attention"
# AttnMeta's per-layer options beyond window and softcap that every implementation honours (FUSES, as
# kernels/qmatmul.py's): a model with sinks (gpt-oss) refuses at load a lab copy from before them,
# which would ignore them silently.
FUSES = ("sinks",)
TOL = {torch.float32: 1e-4, torch.bfloat16: 3e-2}


def reference(q: torch.Tensor, kv: StridedKV, meta: AttnMeta, scale: float) -> torch.Tensor:
    """q: [tokens, q_heads, head_dim]; kv: logical [streams, cells, kv_heads, head_dim] -> like q.

    Plain per-sequence, per-query loops in float32: obviously correct, slow. The query at position
    `pos` sees keys `lo .. pos`, lo = pos - window + 1 with a window (else 0).
    """
    window, softcap, sinks = meta.window, meta.softcap, meta.sinks
    k, v = _sdpa.dequant(kv.k, kv.k_scale), _sdpa.dequant(kv.v, kv.v_scale)
    out = torch.empty(q.shape, dtype=torch.float32, device=q.device)
    group = q.shape[1] // k.shape[2]
    for b in range(meta.n_seqs):
        stream, n_q, n_kv = (int(meta.seq_streams[b]), int(meta.q_lens[b]), int(meta.kv_lens[b]))
        keys = k[stream, :n_kv].float().repeat_interleave(group, dim=1)    # [n_kv, q_heads, dim]
        vals = v[stream, :n_kv].float().repeat_interleave(group, dim=1)
        for j in range(n_q):
            row, pos = int(meta.q_offsets[b]) + j, n_kv - n_q + j
            lo = max(0, pos - window + 1) if window else 0
            scores = torch.einsum("hd,khd->hk", q[row].float(), keys[lo: pos + 1]) * scale
            if softcap:
                scores = softcap * torch.tanh(scores / softcap)
            out[row] = torch.einsum("hk,khd->hd", softmax_sinks(scores, sinks), vals[lo: pos + 1])
    return out.to(q.dtype)


def cpu(q: torch.Tensor, kv: StridedKV, meta: AttnMeta, scale: float) -> torch.Tensor:
    """Same contract as `reference`: every row through the C row kernel where it applies
    (batch-invariant: module docstring), else the cheapest torch SDPA form (_attention_sdpa.py)."""
    wide = _native.spread(q.shape[1], kv)   # more than 16 query heads on one KV head: units of 16
    if _native_ok(q, wide, meta):
        return _native.rows(_LIB, q, wide, meta, scale, meta.window, meta.softcap)
    return _sdpa.step(q, kv, meta, scale)


def _native_ok(q: torch.Tensor, kv: StridedKV, meta: AttnMeta) -> bool:
    """The C row kernel serves: built here (`_LIB`) and able to read these inputs (`_native.fits`)."""
    return _LIB is not None and _native.fits(q, kv, meta)


def cpu_path() -> str:
    """What `cpu` computes with here (shown in /props, /lab and `slotserver top`)."""
    return _native.cpu_path(_LIB)


LOG2E = 1.4426950408889634
# Decode (flash-decoding): the grid is (sequences, KV heads, splits); each program reads one chunk
# of its sequence's visible cells in [DECODE_BLOCK_N, head_dim] tiles, and a second small kernel
# merges the chunks' partials. `decode_splits` picks the number of chunks.
DECODE_BLOCK_N = 64        # cells per K/V tile (a power of two >= 16)
DECODE_MIN_CHUNK = 256     # no chunk shorter than this many cells (tests lower it to force splits)
DECODE_MAX_SPLITS = 64
DECODE_WAVES = 4           # programs wanted: this many per SM (the SMs overlap several programs' loads)
DECODE_DOT_MIN_GROUP = 2   # GQA groups from this size use tl.dot, padded to 16 rows; smaller ones the broadcast form
DECODE_WARPS = 4
DECODE_STAGES = 3          # software-pipelined K/V tile loads (cp.async on sm_80+)
DECODE_FORCE_SPLITS: int | None = None   # a fixed number of splits (tests, benchmarks); None: decode_splits
DEFAULT_SMS = 132          # the SM count assumed off a GPU (the interpreter): an H100 SXM
# K/V tiles through TMA tensor descriptors (sm_90+, 16-bit caches with 16-byte aligned rows, head_dim
# a power of two): 1-3.4% faster on each of the sixth GPU round's four prefill rows (_attention_tl.py,
# above PREFILL16).
PREFILL_TMA = True

# The prefill's tiles per head size: _attention_tl.py's PREFILL16* (both ops read them).
prefill_tiles = _tl.prefill_tiles


def triton(q: torch.Tensor, kv: StridedKV, meta: AttnMeta, scale: float) -> torch.Tensor:
    """Same contract as `cpu`: q [tokens, q_heads, head_dim], kv logical [streams, cells, kv_heads, head_dim]."""
    _check(q, kv, meta)
    kv_heads, dim = kv.k.shape[2], q.shape[2]
    group = q.shape[1] // kv_heads
    quant = kv.k_scale is not None
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    ks, vs = (kv.k_scale, kv.v_scale) if quant else (kv.k, kv.v)  # unused pointers without q8
    sinks = _sinks_arg(meta, q)
    args = (sinks, q.stride(0), q.stride(1), *kv.k.stride()[:3], *kv.v.stride()[:3],
            *(kv.k_scale.stride() if quant else (0, 0, 0)), out.stride(0), out.stride(1), scale * LOG2E,
            meta.window, float(meta.softcap or 1.0))
    if meta.max_q == 1:
        _decode(q, kv, meta, out, ks, vs, args, group, quant)
    else:
        ieee = q.dtype == torch.float32 or _interpreted()
        tiles = prefill_tiles(q.dtype, dim)
        tma = _tma_ok(q, kv, PREFILL_TMA)
        if tma:   # every launch: triton keeps the allocator per thread (a ContextVar); engines step on their own
            _triton.set_allocator(_tma_scratch)
        grid = (meta.n_seqs, kv_heads, _triton.cdiv(meta.max_q * group, tiles["BLOCK_M"]))
        _attn_prefill_kernel[grid](
            q, kv.k, kv.v, ks, vs, out, meta.seq_streams, meta.q_lens, meta.kv_lens, meta.q_offsets, *args,
            GROUP=group, HEAD_DIM=dim, BLOCK_D=max(16, _triton.next_power_of_2(dim)), QUANT=quant,
            IEEE_DOT=ieee, SOFTCAP=bool(meta.softcap), SINKS=meta.sinks is not None, TMA=tma, **tiles)
    return out


def _tma_ok(q: torch.Tensor, kv: StridedKV, wanted: bool) -> bool:
    """TMA descriptors for the prefill's K/V tiles: wanted, on an sm_90+ card (or the interpreter),
    16-bit queries over a 16-bit cache whose head_dim is a power of two in 16..256 (a TMA box's
    rows hold at most 256 values) and whose rows start 16-byte aligned."""
    dim = q.shape[2]
    if not wanted or kv.k_scale is not None or {q.dtype, kv.k.dtype} - {torch.float16, torch.bfloat16}:
        return False
    if not 16 <= dim <= 256 or dim & (dim - 1):
        return False
    if not _interpreted() and torch.cuda.get_device_capability(q.device)[0] < 9:
        return False
    return not any(t.stride(3) != 1 or (t.data_ptr() | t.stride(0) * 2 | t.stride(1) * 2 | t.stride(2) * 2) % 16
                   for t in (kv.k, kv.v))


def _tma_scratch(size: int, alignment: int, stream) -> torch.Tensor:
    """triton's allocator for the descriptors a kernel makes on the device (their scratch memory)."""
    return torch.empty(size, dtype=torch.int8, device="cuda")


def _sinks_arg(meta: AttnMeta, q: torch.Tensor) -> torch.Tensor:
    """The layer's sinks as the kernels read them (float32 [q_heads] on q's device); without
    sinks any float32 tensor (never read: SINKS is off)."""
    if meta.sinks is None:
        return meta.kv_lens   # a pointer the kernel never dereferences
    return meta.sinks.to(device=q.device, dtype=torch.float32).contiguous()


def decode_splits(n_seqs: int, kv_heads: int, span: int, device: torch.device) -> int:
    """Chunks per (sequence, KV head) for a decode step whose longest visible span is `span` cells:
    _attention_tl.py's `split_count` over this module's DECODE_* constants and the device's SMs
    (constant inside a power-of-two bucket of spans, for CUDA graphs); DECODE_FORCE_SPLITS: fixed."""
    if DECODE_FORCE_SPLITS:
        return max(1, int(DECODE_FORCE_SPLITS))
    return _tl.split_count(n_seqs, kv_heads, span, sm_count(device, DEFAULT_SMS), DECODE_WAVES, DECODE_MIN_CHUNK,
                           DECODE_MAX_SPLITS)


def _decode(q: torch.Tensor, kv: StridedKV, meta: AttnMeta, out: torch.Tensor, ks: torch.Tensor, vs: torch.Tensor,
            args: tuple, group: int, quant: bool) -> None:
    """One query per sequence: `_attn_decode_kernel` over (sequences, KV heads, splits), then with
    several splits `_tl.combine` over (sequences, query heads)."""
    n_seqs, q_heads, dim = meta.n_seqs, q.shape[1], q.shape[2]
    kv_heads = q_heads // group
    span = min(meta.max_kv, meta.window) if meta.window else meta.max_kv
    n_splits = decode_splits(n_seqs, kv_heads, span, q.device)
    dot = group >= DECODE_DOT_MIN_GROUP
    m, l_sum, acc = _tl.decode_partials(out, n_seqs, n_splits)
    _attn_decode_kernel[(n_seqs, kv_heads, n_splits)](
        q, kv.k, kv.v, ks, vs, out, m, l_sum, acc, meta.seq_streams, meta.kv_lens, meta.q_offsets, *args,
        GROUP=group, HEAD_DIM=dim, BLOCK_G=max(16 if dot else 1, _triton.next_power_of_2(group)),
        BLOCK_D=max(16, _triton.next_power_of_2(dim)), BLOCK_N=DECODE_BLOCK_N, QUANT=quant,
        SOFTCAP=bool(meta.softcap), DOT=dot, IEEE_DOT=q.dtype == torch.float32 or _interpreted(),
        SPLIT=n_splits > 1, SINKS=meta.sinks is not None, num_warps=DECODE_WARPS, num_stages=DECODE_STAGES)
    if n_splits > 1:
        _tl.combine(m, l_sum, acc, out, meta.q_offsets, args[0], meta.sinks is not None)


def _interpreted() -> bool:
    """True when triton was imported with TRITON_INTERPRET=1 (kernels run on CPU tensors). `resolve`:
    before this module's first launch its kernels are lazy_triton's stand-ins, whose type says
    nothing (that first launch then took the bf16 dot the interpreter multiplies as bit patterns)."""
    return type(lazy_triton.resolve(_attn_prefill_kernel)).__name__ == "InterpretedFunction"


def _check(q: torch.Tensor, kv: StridedKV, meta: AttnMeta) -> None:
    assert q.dim() == 3 and q.stride(2) == 1, f"q must be [tokens, q_heads, head_dim], unit last stride: {q.stride()}"
    assert kv.k.dim() == 4 and kv.k.shape == kv.v.shape, "k, v must be [streams, cells, kv_heads, head_dim]"
    assert kv.k.shape[3] == q.shape[2] and q.shape[1] % kv.k.shape[2] == 0, "head_dim / GQA group mismatch"
    assert kv.k.stride(3) == 1 and kv.v.stride(3) == 1, "head_dim must be the innermost dim of the view"
    if kv.k_scale is not None:
        assert kv.k.dtype == kv.v.dtype == torch.int8 and kv.v_scale is not None
        assert kv.k_scale.shape == kv.k.shape[:3] and kv.k_scale.stride() == kv.v_scale.stride()
        assert kv.k_scale.dtype == kv.v_scale.dtype == torch.float32
    else:
        assert kv.k.dtype == kv.v.dtype and kv.k.dtype in (q.dtype, torch.float16), \
            f"kv {kv.k.dtype} must match q {q.dtype} or be float16"
    for t in (meta.seq_streams, meta.q_lens, meta.kv_lens, meta.q_offsets):
        assert t.dtype == torch.int64 and t.is_contiguous() and t.device == q.device


def example_inputs(gen: torch.Generator, dtype: torch.dtype) -> tuple:
    """A random ragged batch (mixed decode and prefill chunks, all decode, or all prefill, fresh
    prompts included) on shuffled streams, over a plain, a heads-first (strided), a q8 or an f16 cache;
    odd head_dim and group sizes included."""
    kv_heads = int(torch.randint(1, 4, (), generator=gen))
    group = int(torch.randint(1, 4, (), generator=gen))
    dim = _sdpa.example_dim(gen)
    n_streams, n_cells = 12, 40   # up to 12 sequences: both sides of _sdpa.EACH_CHUNK_MAX
    n_seq = int(torch.randint(1, n_streams + 1, (), generator=gen))
    streams = torch.randperm(n_streams, generator=gen)[:n_seq].tolist()
    mode = float(torch.rand((), generator=gen))  # < 0.3: all decode; > 0.8: all prefill (start 0 or not)
    chunks = []
    for s in streams:
        start = int(torch.randint(0, 30, (), generator=gen)) if mode <= 0.9 else 0
        prefill = mode > 0.8 or (mode >= 0.3 and torch.rand((), generator=gen) >= 0.5)
        n_new = int(torch.randint(2, 10, (), generator=gen)) if prefill else 1
        prompt = prefill and bool(torch.rand((), generator=gen) < 0.5)   # AMX rows, where the CPU has it
        chunks.append(SeqChunk(stream=s, start=start, tokens=[0] * n_new, prompt=prompt))
    if torch.rand((), generator=gen) < 0.5:  # the engine's order, decodes first (AttnMeta.split)
        chunks.sort(key=lambda c: len(c.tokens) > 1)
    meta = _sdpa.example_layer(Batch.build(chunks).attn, gen, kv_heads * group)
    # q as the model passes it: the query heads of the roped q|k rows (a strided view)
    q = torch.randn(sum(len(c.tokens) for c in chunks), kv_heads * (group + 1), dim, generator=gen)[:, : kv_heads * group]
    k = torch.randn(n_streams, n_cells, kv_heads, dim, generator=gen)
    v = torch.randn(n_streams, n_cells, kv_heads, dim, generator=gen)
    return q.to(dtype), _example_view(k, v, dtype, int(torch.randint(0, 4, (), generator=gen))), meta, 1 / math.sqrt(dim)


def _example_view(k: torch.Tensor, v: torch.Tensor, dtype: torch.dtype, kind: int) -> StridedKV:
    """kind 0: contiguous (seq_head_dim); 1: heads-first storage, permuted view; 2: int8 + scales;
    3: a float16 cache (`--cache-type-k f16`, the serving default) under queries of `dtype`."""
    if kind == 3:
        return StridedKV(k.half(), v.half())
    if kind == 1:
        k, v = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in (k, v))
    if kind != 2:
        return StridedKV(k.to(dtype), v.to(dtype))
    scales = [t.abs().amax(dim=-1) / 127 for t in (k, v)]
    k8, v8 = (torch.round(t / s.unsqueeze(-1)).to(torch.int8) for t, s in zip((k, v), scales))
    return StridedKV(k8, v8, *scales)


def bench_inputs(device: str, small: bool = False) -> list[tuple[str, tuple]]:
    """`lab check --time`: decode steps (one query row per sequence) over a float16 cache of
    Llama-8B's geometry (8 KV heads, 32 q heads, head_dim 128), in both strided orders."""
    sizes = [(2, 40, 2, 4, 16)] if small else [(1, 4096, 8, 32, 128), (32, 2048, 8, 32, 128), (64, 4096, 8, 32, 128)]
    out = []
    for b, ctx, kvh, qh, d in sizes:
        k, v = (torch.randn(b, kvh, ctx, d, device=device, dtype=torch.float16) for _ in range(2))   # [B, H, L, D]
        q = torch.randn(b, qh, d, device=device, dtype=torch.bfloat16)
        meta = Batch.build([SeqChunk(stream=i, start=ctx - 1, tokens=[0]) for i in range(b)], device=device).attn
        out.append((f"decode {b} x {ctx}, head_seq_dim", (q, StridedKV(k.transpose(1, 2), v.transpose(1, 2)), meta, d ** -0.5)))
        k2, v2 = (t.transpose(1, 2).contiguous() for t in (k, v))                                      # [B, L, H, D]
        out.append((f"decode {b} x {ctx}, seq_head_dim", (q, StridedKV(k2, v2), meta, d ** -0.5)))
    return out


def bench_flops(q: torch.Tensor, kv: StridedKV, meta: AttnMeta, scale: float) -> int:
    """QK and PV: 4 flops per (query head, visible cell, dim)."""
    return 4 * q.shape[1] * q.shape[2] * int(meta.kv_lens.sum())


def _aot(dtype: str, quant: bool, decode: bool, group: int = 3, dim: int = 64, cache: str | None = None,
         split: bool = True, sinks: bool = False) -> tuple:
    cache = "i8" if quant else (cache or dtype)
    sig = {"q_ptr": f"*{dtype}", "k_ptr": f"*{cache}", "v_ptr": f"*{cache}", "ks_ptr": "*fp32",
           "vs_ptr": "*fp32", "out_ptr": f"*{dtype}"}
    sig |= {"m_ptr": "*fp32", "l_ptr": "*fp32", "acc_ptr": "*fp32"} if decode else {}
    sig |= {"streams_ptr": "*i64"}
    sig |= {"kv_lens_ptr": "*i64"} if decode else {"q_lens_ptr": "*i64", "kv_lens_ptr": "*i64"}
    sig |= {"q_offsets_ptr": "*i64", "sinks_ptr": "*fp32" if sinks else "*i64"}   # no sinks: kv_lens, unread
    sig |= {n: "i32" for n in ("stride_qt", "stride_qh", "stride_ks", "stride_kc", "stride_kh", "stride_vs",
                               "stride_vc", "stride_vh", "stride_ss", "stride_sc", "stride_sh",
                               "stride_ot", "stride_oh")}
    sig |= {"qk_scale": "fp32", "window": "i32", "softcap": "fp32"}
    pow2 = lambda n: 1 << (n - 1).bit_length()   # noqa: E731 - triton.next_power_of_2, without importing triton here
    const = {"GROUP": group, "HEAD_DIM": dim, "BLOCK_D": max(16, pow2(dim)), "QUANT": quant, "SOFTCAP": False,
             "SINKS": sinks}
    if decode:
        dot = group >= DECODE_DOT_MIN_GROUP
        const |= {"BLOCK_G": max(16 if dot else 1, pow2(group)), "BLOCK_N": DECODE_BLOCK_N, "DOT": dot,
                  "IEEE_DOT": dtype == "fp32", "SPLIT": split}
    else:
        if dtype == "fp32":
            tiles = prefill_tiles(torch.float32, dim)
            const |= {"BLOCK_M": tiles["BLOCK_M"], "BLOCK_N": tiles["BLOCK_N"], "IEEE_DOT": True, "TMA": False}
        else:   # the 16-bit tiles with their launch options and the alignment the JIT sees, as they serve
            tiles = prefill_tiles(torch.bfloat16, dim)
            const |= {"BLOCK_M": tiles["BLOCK_M"], "BLOCK_N": tiles["BLOCK_N"], "IEEE_DOT": False,
                      "TMA": PREFILL_TMA and not quant}
            sig |= {name: "constexpr" for name in const}
            return (_attn_prefill_kernel, sig, const, {k: tiles[k] for k in ("num_warps", "num_stages")}
                    | {"aligned": PREFILL_ALIGNED})
    sig |= {name: "constexpr" for name in const}
    if decode:   # its launch options and alignment as it serves (without them ptxas reports spills it never has)
        return (_attn_decode_kernel, sig, const, {"num_warps": DECODE_WARPS, "num_stages": DECODE_STAGES,
                                                  "aligned": PREFILL_ALIGNED + ("m_ptr", "l_ptr", "acc_ptr")})
    return (_attn_prefill_kernel, sig, const)


# What the JIT sees 16-aligned when a prefill or decode serves (torch's pointers; the strides of [tokens,
# heads, head_dim] rows and of either strided cache order at head_dim 64/128): without it the AOT compile
# loads 2 bytes at a time, is not software-pipelined and spills (lab/aot.py, `aligned`).
PREFILL_ALIGNED = ("q_ptr", "k_ptr", "v_ptr", "out_ptr", "stride_qt", "stride_qh", "stride_ks", "stride_kc",
                   "stride_kh", "stride_vs", "stride_vc", "stride_vh", "stride_ot", "stride_oh")
# SmolLM2-135M geometry (group 3, head_dim 64): bf16, f16 and q8 caches, decode (split and not) and
# prefill; Llama-3-8B's decode (group 4, head_dim 128); the decode combine for both head sizes;
# gpt-oss-20b's (group 8, head_dim 64, sinks) decode, combine and prefill; Llama-3-8B's and gemma2's
# (head_dim 256) prefill.
AOT = [_aot("bf16", False, True), _aot("bf16", True, True), _aot("bf16", False, True, cache="fp16"),
       _aot("bf16", False, True, split=False), _aot("bf16", False, True, group=4, dim=128),
       _aot("bf16", False, False), _aot("bf16", True, False), _aot("fp32", False, True),
       _tl.aot_combine("bf16"), _tl.aot_combine("bf16", 128),
       _aot("bf16", False, True, group=8, cache="fp16", sinks=True), _tl.aot_combine("bf16", sinks=True),
       _aot("bf16", False, False, group=8, cache="fp16", sinks=True), _aot("bf16", False, False, group=4, dim=128),
       _aot("bf16", False, False, group=2, dim=256)]
