"""Layouts holding the same element type give the same floats: a live swap between them changes no
answer (issue 32). Flat and paged layouts hand attention different views (strided / block table),
and both attention kernels run every row through the one C kernel (kernels/attention.c)."""

from __future__ import annotations

import pytest
import torch

from slotserver.engine.kv_cache import KVCache
from slotserver.runtime import native
from slotserver.runtime.kernel_set import KERNEL_CONTRACT
from slotserver.runtime.kv_spec import KVSpec
from slotserver.runtime.layouts import available_layouts
from slotserver.runtime.loader import default_dir, load_by_path
from slotserver.runtime.batch import Batch, SeqChunk

FLOAT_LAYOUTS = [n for n in available_layouts() if n != "q8"]
KERNELS = {op: load_by_path(default_dir("kernels") / f"{op}.py", KERNEL_CONTRACT).module
           for op in ("attention", "paged_attention")}
needs_c = pytest.mark.skipif(KERNELS["attention"]._LIB is None, reason="no C compiler: SDPA forms serve")


def _filled(layout: str, kv_dtype: torch.dtype, gen_seed: int, chunks: list[SeqChunk]) -> KVCache:
    """A cache of `layout` holding the same random K/V, written row by row as the model does."""
    gen = torch.Generator().manual_seed(gen_seed)
    cache = KVCache.create(layout, KVSpec(2, 5, 96, 3, 64, kv_dtype))
    for c in chunks:
        n = c.start + len(c.tokens)
        k, v = (torch.randn(n, 3, 64, generator=gen) for _ in "kv")
        cache.write(1, torch.full((n,), c.stream), torch.arange(n), k.to(kv_dtype), v.to(kv_dtype))
    return cache


@needs_c
@pytest.mark.parametrize("q_dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("kv_dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("window", [0, 7])
def test_same_element_type_same_floats(q_dtype, kv_dtype, window):
    """Decode rows and prefill chunks of a ragged batch, under a window or not: every float layout
    returns the bits the first one returns."""
    chunks = [SeqChunk(3, 40, [0]), SeqChunk(0, 17, [0]), SeqChunk(4, 0, [0] * 23), SeqChunk(1, 60, [0] * 5)]
    batch = Batch.build(chunks)
    meta = batch.attn.with_layer(window, 0.0)
    q = torch.randn(batch.n_tokens, 9, 64,
                    generator=torch.Generator().manual_seed(5)).to(q_dtype)
    outs = {}
    for name in FLOAT_LAYOUTS:
        view = _filled(name, kv_dtype, 11, chunks).view(1)
        kernel = KERNELS["paged_attention" if view.paged else "attention"]
        outs[name] = kernel.cpu(q, view, meta, 0.125)
    first = outs[FLOAT_LAYOUTS[0]]
    for name, out in outs.items():
        assert torch.equal(out, first), f"{name} differs from {FLOAT_LAYOUTS[0]} by {(out - first).abs().max()}"


@needs_c
def test_q8_under_bf16_queries_is_computed_in_float32():
    """q8 (int8 K/V with a scale per row) runs through the same C kernel as the float caches: its
    values are dequantized and summed in float32 whatever q's type, so under bf16 queries the
    output is the float32 reference rounded once to bf16 (torch's SDPA, which served q8 before,
    dequantized to bf16 and summed there: errors of several bf16 steps)."""
    chunks = [SeqChunk(3, 40, [0]), SeqChunk(0, 17, [0] * 4), SeqChunk(1, 60, [0])]
    view = _filled("q8", torch.float32, 13, chunks).view(1)
    meta = Batch.build(chunks).attn
    q = torch.randn(6, 9, 64, generator=torch.Generator().manual_seed(2)).bfloat16()
    kernel = KERNELS["attention"]
    got = kernel.cpu(q, view, meta, 0.125).float()
    want = kernel.reference(q.float(), view, meta, 0.125)
    excess = (got - want).abs() - (2.0 ** -8 * want.abs() + 1e-6)   # one bf16 rounding: <= 2^-9 relative
    assert float(excess.max()) <= 0.0, float((got - want).abs().max())
