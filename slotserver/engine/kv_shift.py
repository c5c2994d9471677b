"""Applying a `KVShift` (context shift, cache reuse) to the KV cache: llama.cpp's `seq_rm` + `seq_add`.

Layout-agnostic: it goes through the layout contract only. `export_stream` reads the stream's
cells in the canonical form `[n_layers, n, kv_heads, head_dim]` (q8 dequantizes, paged gathers its
blocks), the moved keys are re-rotated by their position delta with the model's own RoPE
(model/rope_shift.py), and `write`, the same call a forward stores its rows with, puts the moved
rows at their new positions (q8 quantizes, paged allocates or copies-on-write as for any write).
So every layout in layouts/, and a lab layout that keeps the contract, shifts exactly: in float32
the result equals a fresh prefill of the kept tokens at their new positions up to float rounding
(tests/test_context_shift.py checks it on each layout).

Paged layouts: the stream is trimmed to the first moved-to cell before the write (the moved rows
are already read out), so the write takes fresh blocks for what it freed and the pool never holds
more blocks during a shift than before it (a block shared with another stream costs at most one
copy-on-write); the blocks past `keep` go back afterwards.

Nothing is recomputed: every supported architecture uses RoPE (sliding-window layers included,
see rope_shift.py). A layout module may declare `KV_SHIFT = False` when its stored keys cannot be
re-rotated (e.g. a compressed K); `--context-shift` and `--cache-reuse` are then refused at startup
(`shift_problem`), and so is a model whose keys cannot be re-rotated.
"""

from __future__ import annotations

import torch

from slotserver.engine.config import EngineConfig
from slotserver.engine.context_shift import KVShift
from slotserver.engine.kv_cache import KVCache
from slotserver.errors import ConfigError
from slotserver.model.rope_shift import rotate_keys, shift_problem as model_problem


def shift_problem(model, cache: KVCache) -> str | None:
    """Why KV shifts cannot run on this model and layout, or None when they can."""
    problem = model_problem(model)
    if problem is None and getattr(cache.loaded.module, "KV_SHIFT", True) is False:
        problem = f"the KV layout {cache.name} declares that its keys cannot be moved (KV_SHIFT = False)"
    return problem


def check_shift_support(config: EngineConfig, model, cache: KVCache) -> None:
    """At startup: refuse --context-shift / --cache-reuse (ConfigError, one line) where keys cannot move."""
    flags = [f for f, on in (("--context-shift", config.context_shift), ("--cache-reuse", config.cache_reuse)) if on]
    problem = shift_problem(model, cache) if flags else None
    if problem is not None:
        raise ConfigError(f"{' and '.join(flags)} cannot run: {problem}")


@torch.no_grad()
def apply_shift(cache: KVCache, model, shift: KVShift) -> None:
    """Move the shift's spans down (in order), K re-rotated by dst - src; keep `shift.keep` cells."""
    if not shift.spans:
        cache.trim(shift.stream, shift.keep)
        return
    device = cache.spec.device
    k, v = cache.export_stream(shift.stream, shift.n_source)          # [n_layers, n_source, kv_heads, hd]
    src = torch.cat([torch.arange(s.src, s.src + s.n) for s in shift.spans])            # [m]
    dst = torch.cat([torch.arange(s.dst, s.dst + s.n) for s in shift.spans])            # [m]
    rows = src.to(k.device)
    k_moved = rotate_keys(model, k[:, rows], (dst - src))            # [n_layers, m, kv_heads, hd] f32
    v_moved = v[:, rows]                                             # V has no position: unchanged
    cache.trim(shift.stream, int(dst[0]))   # paged: the moved-to range gets fresh blocks, no more than before
    streams = torch.full((dst.numel(),), shift.stream, dtype=torch.long, device=device)
    positions = dst.to(device)
    for layer in range(k_moved.shape[0]):
        cache.write(layer, streams, positions, k_moved[layer].to(device), v_moved[layer].to(device))
    cache.trim(shift.stream, shift.keep)
