"""The prefill attention kernels compiled on a CUDA card (bf16): long chunks, so the 16-bit tiles'
unmasked loop runs, at the three tilings' head sizes (Qwen2.5-0.5B's 14/2 heads of 64, Llama-8B's
32/8 of 128, gemma2's 8/4 of 256), over both strided cache orders and pages; attention.py with and
without TMA descriptors (sm_90+: Hopper's copy engine; cells past kv_len must read as 0, not as the
NaN stored there), with a window and a softcap. The interpreter runs smaller cases on the CPU
(tests/test_triton_kernels.py::test_triton_long_prefill_chunks_match_the_reference); only a card
runs the compiled tiles, the TMA loads and the last-tile-first order. `playground/gpu_check.sh`
runs this file with the other tests/test_gpu_*.py.
"""

from __future__ import annotations

import math

import pytest
import torch

from slotserver.runtime.batch import Batch, SeqChunk
from slotserver.runtime.kernel_set import KERNEL_CONTRACT
from slotserver.runtime.kv_spec import PagedKV, StridedKV
from slotserver.runtime.loader import default_dir, load_by_path

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

GEOMETRIES = {"qwen": (2, 7, 64), "llama": (8, 4, 128), "gemma2": (4, 2, 256)}   # kv heads, group, head_dim
PAGE = 16


def _case(geo: tuple, window: int, softcap: float, heads_first: bool, gen: torch.Generator):
    """A fresh 700-token prompt and a 300-token chunk after 400 cached cells, NaN past each kv_len."""
    kv_heads, group, dim = geo
    meta = Batch.build([SeqChunk(stream=1, start=0, tokens=[0] * 700), SeqChunk(stream=0, start=400, tokens=[0] * 300)],
                       device="cuda").attn.with_layer(window, softcap)
    q = torch.randn(1000, kv_heads * group, dim, generator=gen, device="cuda").to(torch.bfloat16)
    shape = (2, kv_heads, 768, dim) if heads_first else (2, 768, kv_heads, dim)
    k, v = (torch.randn(shape, generator=gen, device="cuda").to(torch.bfloat16) for _ in range(2))
    if heads_first:
        k, v = k.transpose(1, 2), v.transpose(1, 2)               # logical [streams, cells, heads, dim]
    for t in (k, v):
        t[1, 700:], t[0, 700:] = float("nan"), float("nan")     # past kv_len: 700 for both
    return q, StridedKV(k, v), meta, 1 / math.sqrt(dim)


@pytest.mark.parametrize("geo", list(GEOMETRIES), ids=str)
@pytest.mark.parametrize("tma", [False, True], ids=["pointers", "tma"])
def test_the_prefill_kernel_on_the_card_matches_the_reference(geo, tma):
    mod = load_by_path(default_dir("kernels") / "attention.py", KERNEL_CONTRACT).module
    mod.PREFILL_TMA = tma
    gen = torch.Generator(device="cuda").manual_seed(3)
    for window, softcap, heads_first in ((0, 0.0, False), (0, 0.0, True), (200, 0.0, False), (0, 30.0, True)):
        q, kv, meta, scale = _case(GEOMETRIES[geo], window, softcap, heads_first, gen)
        assert mod._tma_ok(q, kv, tma) == (tma and torch.cuda.get_device_capability()[0] >= 9)   # sm_90+ only
        clean = StridedKV(*(torch.nan_to_num(t) for t in (kv.k, kv.v)))
        want = mod.reference(q, clean, meta, scale).float()
        got = mod.triton(q, kv, meta, scale).float()
        err = (got - want).abs()
        assert torch.all(err <= 2e-2 + 2e-2 * want.abs()), (geo, window, softcap, heads_first, float(err.max()))


@pytest.mark.parametrize("geo", list(GEOMETRIES), ids=str)
def test_the_paged_prefill_kernel_on_the_card_matches_the_reference(geo):
    mod = load_by_path(default_dir("kernels") / "paged_attention.py", KERNEL_CONTRACT).module
    gen = torch.Generator(device="cuda").manual_seed(4)
    q, kv, meta, scale = _case(GEOMETRIES[geo], 0, 0.0, False, gen)
    kv_heads, _, dim = GEOMETRIES[geo]
    order = torch.randperm(2 * 768 // PAGE, generator=gen, device="cuda")        # shuffled pages
    pages = [torch.empty(2 * 768 // PAGE, PAGE, kv_heads, dim, device="cuda", dtype=torch.bfloat16) for _ in range(2)]
    for dst, src in zip(pages, (kv.k, kv.v)):
        dst[order] = src.reshape(-1, PAGE, kv_heads, dim)
    paged = PagedKV(pages[0], pages[1], order.view(2, -1).int(), PAGE)
    clean = StridedKV(*(torch.nan_to_num(t) for t in (kv.k, kv.v)))
    want = mod.reference(q, PagedKV(*(torch.nan_to_num(t) for t in pages), paged.block_table, PAGE), meta, scale)
    assert torch.allclose(want.float(), load_by_path(default_dir("kernels") / "attention.py", KERNEL_CONTRACT)
                          .module.reference(q, clean, meta, scale).float(), atol=1e-2)
    got = mod.triton(q, paged, meta, scale).float()
    err = (got - want.float()).abs()
    assert torch.all(err <= 2e-2 + 2e-2 * want.float().abs()), (geo, float(err.max()))
