"""attention's torch formulations: what `attention.cpu` runs where its C row kernel does not apply
(no compiler, SLOTSERVER_NATIVE=0, inputs the C does not read), and the helpers its reference and
paged_attention's torch form share (`band`, `sdpa`, `dequant`), and the pieces of both ops'
example inputs (`example_dim`, `example_layer`: one head size and one layer's options drawn alike).

`step` picks the cheapest SDPA formulation per step (docs/performance.md): all-decode steps
unpadded with a broadcast key mask (`_cpu_decode`); a mixed step split into its decode rows and its
prefill chunks (`AttnMeta.split`); up to EACH_CHUNK_MAX prefill chunks one call each (no padding,
plain causal for a fresh prompt: `_cpu_each_chunk`); more chunks one padded, masked call. Each
sequence only reads `max_kv` cells of its stream; when the batch's streams are contiguous (sequence
defragmentation), K/V are sliced, not gathered (`select`).
A part of attention.py and of paged_attention.py (runtime/kernel_parts.py).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from slotserver.runtime.batch import AttnMeta, softmax_sinks
from slotserver.runtime.kv_spec import StridedKV

EACH_CHUNK_MAX = 8   # up to this many prefill chunks run one SDPA each; more share a padded one


def step(q: torch.Tensor, kv: StridedKV, meta: AttnMeta, scale: float) -> torch.Tensor:
    """attention's `cpu` contract in torch (where the C row kernel does not apply): the cheapest SDPA
    formulation of this step (attention.py's docstring)."""
    window, softcap, sinks = meta.window, meta.softcap, meta.sinks
    if meta.max_q == 1:
        return _cpu_decode(q, kv, meta, scale, window, softcap, sinks)
    if meta.split is not None:  # decodes first, then prefill chunks: never pad a decode row
        dec, pre = meta.split
        return torch.cat([_cpu_decode(q[: dec.n_seqs], kv, dec, scale, window, softcap, sinks),
                          step(q[dec.n_seqs:], kv, pre, scale)])
    if meta.n_seqs <= EACH_CHUNK_MAX:
        return _cpu_each_chunk(q, kv, meta, scale, window, softcap, sinks)
    n_seq, max_q, max_kv = meta.n_seqs, meta.max_q, meta.max_kv
    q_heads, dim = q.shape[1], q.shape[2]
    lo = max(0, int((meta.kv_lens - meta.q_lens).min()) - window + 1) if window else 0  # no query sees below
    keys = dequant(select(kv.k, meta, lo), select_scale(kv.k_scale, meta, lo), q.dtype)  # [B, kv_heads, L, dim]
    vals = dequant(select(kv.v, meta, lo), select_scale(kv.v_scale, meta, lo), q.dtype)
    qp = q[meta.pad_index].transpose(1, 2)                              # [B, q_heads, max_q, dim]
    key_pos = torch.arange(lo, max_kv, device=q.device).view(1, 1, 1, max_kv - lo)
    mask = band(key_pos, meta.pad_positions.view(n_seq, 1, max_q, 1), window)  # [B, 1, max_q, L]
    out = sdpa(qp, keys, vals, mask, scale, softcap, sinks=sinks)
    return out.transpose(1, 2).reshape(n_seq * max_q, q_heads, dim)[meta.valid_rows]  # [tokens, q_heads, dim]


def band(key_pos: torch.Tensor, q_pos: torch.Tensor, window: int) -> torch.Tensor:
    """Which keys a query sees: causal, and within `window` positions when there is one."""
    seen = key_pos <= q_pos
    return seen & (key_pos > q_pos - window) if window else seen


def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, scale: float,
          softcap: float, causal: bool = False, sinks: torch.Tensor | None = None) -> torch.Tensor:
    """q [B, q_heads, M, dim], k/v [B, kv_heads, L, dim]: torch's SDPA (native GQA); with a softcap
    or sinks (which SDPA cannot apply) the same maths written out in float32."""
    gqa = q.shape[1] != k.shape[1]
    if not softcap and sinks is None:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, scale=scale, enable_gqa=gqa)
    group = q.shape[1] // k.shape[1]
    kf, vf = (t.float().repeat_interleave(group, dim=1) for t in (k, v))
    scores = torch.matmul(q.float(), kf.transpose(-1, -2)) * scale     # [B, q_heads, M, L]
    if softcap:
        scores = softcap * torch.tanh(scores / softcap)
    if causal:
        mask = torch.ones(scores.shape[-2:], dtype=torch.bool, device=q.device).tril(scores.shape[-1] - scores.shape[-2])
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return torch.matmul(softmax_sinks(scores, sinks), vf).to(q.dtype)


def _cpu_each_chunk(q: torch.Tensor, kv: StridedKV, meta: AttnMeta, scale: float, window: int = 0,
                    softcap: float = 0.0, sinks: torch.Tensor | None = None) -> torch.Tensor:
    """A few prefill chunks, one SDPA each: no padding to the longest chunk, and a fresh prompt (no
    cached prefix) is plain causal. Whole prefill steps in the model: 4 x 128 tokens tie with one
    padded call (176 vs 180 ms); 180 + 3 x 40 tokens: 125 vs 139 ms. One chunk: 2.4x faster
    attention than the padded path. With a window, each chunk reads from its first query's window."""
    outs = []
    for stream, off, n_q, n_kv in zip(*(t.tolist() for t in (meta.seq_streams, meta.q_offsets, meta.q_lens, meta.kv_lens))):
        lo = max(0, n_kv - n_q - window + 1) if window else 0
        keys = dequant(kv.k[stream, lo:n_kv], None if kv.k_scale is None else kv.k_scale[stream, lo:n_kv], q.dtype)
        vals = dequant(kv.v[stream, lo:n_kv], None if kv.v_scale is None else kv.v_scale[stream, lo:n_kv], q.dtype)
        causal = n_kv == n_q and not window                               # else: queries sit at the end
        mask = None if causal else band(torch.arange(lo, n_kv, device=q.device),
                                         torch.arange(n_kv - n_q, n_kv, device=q.device).unsqueeze(1), window)
        out = sdpa(q[off: off + n_q].transpose(0, 1).unsqueeze(0), keys.transpose(0, 1).unsqueeze(0),
                    vals.transpose(0, 1).unsqueeze(0), mask, scale, softcap, causal, sinks)
        outs.append(out[0].transpose(0, 1))                               # [n_q, q_heads, dim]
    return outs[0] if len(outs) == 1 else torch.cat(outs)


def _cpu_decode(q: torch.Tensor, kv: StridedKV, meta: AttnMeta, scale: float, window: int = 0,
                softcap: float = 0.0, sinks: torch.Tensor | None = None) -> torch.Tensor:
    """One query per sequence without the C kernel: torch's SDPA with native GQA (K/V never
    repeated) and the key mask `[B, 1, 1, L]` broadcast (no padding), ~1.5x faster than the padded
    path (docs/performance.md)."""
    n_seq, q_heads, dim = q.shape
    max_kv = meta.max_kv
    first = (meta.kv_lens - window).clamp(min=0) if window else torch.zeros_like(meta.kv_lens)  # [B]
    lo = int(first.min())
    keys = dequant(select(kv.k, meta, lo), select_scale(kv.k_scale, meta, lo), q.dtype)  # [B, kv_heads, L, dim]
    vals = dequant(select(kv.v, meta, lo), select_scale(kv.v_scale, meta, lo), q.dtype)
    mask = None  # one sequence sees all its cells from lo: no mask (the SDPA kernel is faster without)
    if n_seq > 1:
        key_pos = torch.arange(lo, max_kv, device=q.device)
        mask = ((key_pos < meta.kv_lens.unsqueeze(1)) & (key_pos >= first.unsqueeze(1))).view(n_seq, 1, 1, max_kv - lo)
    out = sdpa(q.view(n_seq, q_heads, 1, dim), keys, vals, mask, scale, softcap, sinks=sinks)
    return out.view(n_seq, q_heads, dim)                                          # [tokens, q_heads, dim]


def select(cache: torch.Tensor, meta: AttnMeta, lo: int = 0) -> torch.Tensor:
    """The batch's streams, cells `lo .. max_kv-1`, as `[B, kv_heads, max_kv - lo, dim]`."""
    if meta.stream_base is not None:
        part = cache[meta.stream_base: meta.stream_base + meta.n_seqs, lo: meta.max_kv]
    else:
        part = cache[:, lo: meta.max_kv].index_select(0, meta.seq_streams)
    return part.transpose(1, 2)


def select_scale(scale: torch.Tensor | None, meta: AttnMeta, lo: int = 0) -> torch.Tensor | None:
    """Scales `[streams, cells, kv_heads]` of the batch -> `[B, kv_heads, max_kv - lo, 1]`."""
    return None if scale is None else select(scale.unsqueeze(-1), meta, lo)


def dequant(x: torch.Tensor, scale: torch.Tensor | None, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """A cache (or its cells) in `dtype`: q8's int8 times its per-cell scales, a float one cast."""
    if scale is None:
        return x if x.dtype == dtype else x.to(dtype)
    if scale.dim() == x.dim() - 1:
        scale = scale.unsqueeze(-1)
    return (x.float() * scale.float()).to(dtype)


def example_dim(gen: torch.Generator) -> int:
    """Odd head sizes, and often 32 or 64 (the AMX prompt path takes multiples of 32)."""
    if torch.rand((), generator=gen) < 0.4:
        return (32, 64)[int(torch.randint(0, 2, (), generator=gen))]
    return int(torch.randint(2, 41, (), generator=gen))


def example_layer(meta: AttnMeta, gen: torch.Generator, q_heads: int = 0) -> AttnMeta:
    """Half the cases under a sliding window (1 to 24 cells: shorter and longer than the
    sequences), a third soft-capped (a cap of 0.5 to 3: well inside the scores' range), and with
    q_heads, a third with sinks (logits of scale 2: from negligible to most of the mass)."""
    window = int(torch.randint(1, 25, (), generator=gen)) if torch.rand((), generator=gen) < 0.5 else 0
    softcap = 0.5 + 2.5 * float(torch.rand((), generator=gen)) if torch.rand((), generator=gen) < 0.33 else 0.0
    sinks = None
    if q_heads and torch.rand((), generator=gen) < 0.33:
        sinks = 2 * torch.randn(q_heads, generator=gen)
    return meta.with_layer(window, softcap, sinks)
