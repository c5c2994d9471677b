"""Every kernel module: contract present, and its CPU implementation matches its torch reference
on random shapes (odd sizes included) in float32 and bfloat16, within the module's own tolerance."""

from __future__ import annotations

import pytest
import torch

from slotserver.runtime.kernel_set import KERNEL_CONTRACT, OPS, KernelSet
from slotserver.runtime.kv_spec import PagedKV, StridedKV
from slotserver.lab.check import compare_outputs, move_inputs
from slotserver.runtime.loader import default_dir, load_by_path

KERNEL_FILES = sorted(p for p in default_dir("kernels").glob("*.py") if not p.stem.startswith("_"))


def _kernel(op: str):
    return load_by_path(default_dir("kernels") / f"{op}.py", KERNEL_CONTRACT).module


def test_every_op_the_model_needs_has_a_kernel_file():
    assert {p.stem for p in KERNEL_FILES} >= set(OPS) | {"paged_attention"}
    assert set(KernelSet.load().versions()) >= set(OPS)


@pytest.mark.parametrize("path", KERNEL_FILES, ids=lambda p: p.stem)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("form", ["native", "torch"])
def test_cpu_matches_reference(path, dtype, form):
    """Both CPU forms of a kernel with C source: its C kernel (where a compiler is here) and the
    torch formulation that serves without one."""
    mod = load_by_path(path, KERNEL_CONTRACT).module
    assert mod.OP == path.stem
    if getattr(mod, "NATIVE_C", None) is None and form == "native":
        pytest.skip("no C source in this kernel")
    if form == "native" and (mod._LIB is None):
        pytest.skip("no C compiler here (or SLOTSERVER_NATIVE=0)")
    if form == "torch" and getattr(mod, "_LIB", None) is not None:
        mod._LIB = None   # this module object only: the torch formulation
    gen = torch.Generator().manual_seed(1234)
    for _ in range(25):
        inputs = mod.example_inputs(gen, dtype)
        # each implementation gets its own copy: an op may write into its arguments
        got, want = mod.cpu(*move_inputs(inputs, "cpu")), mod.reference(*move_inputs(inputs, "cpu"))
        if isinstance(want, torch.Tensor):
            assert got.shape == want.shape and got.dtype == want.dtype
        err, ok = compare_outputs(got, want, mod.TOL[dtype])
        assert ok, f"{path.stem} {dtype}: max error {err:.3g} > tol {mod.TOL[dtype]}"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("form", ["native", "torch"])
def test_rms_norm_fused_residual_and_strided_heads_give_the_unfused_floats(dtype, form):
    """What gemma2/3's step runs: the post-norm's residual add inside rms_norm (FUSES acc) and the
    per-head q/k norms on strided rows of the q|k|v projection give exactly the floats of a copy
    normed and a torch add after it."""
    mod = _kernel("rms_norm")
    if form == "native" and mod._LIB is None:
        pytest.skip("no C compiler here (or SLOTSERVER_NATIVE=0)")
    if form == "torch":
        mod._LIB = None
    gen = torch.Generator().manual_seed(7)
    w = (1 + 0.1 * torch.randn(96, generator=gen)).to(dtype)
    y, residual = torch.randn(5, 96, generator=gen).to(dtype), torch.randn(5, 96, generator=gen)
    want = residual + mod.cpu(y, w, 1e-6)
    acc = residual.clone()
    got = mod.cpu(y, w, 1e-6, acc=acc)
    assert got is acc and torch.equal(got, want)
    qkv = torch.randn(5, 7 * 96, generator=gen).to(dtype)
    q = qkv[:, : 4 * 96].view(5, 4, 96)                          # strided: rows 7 * 96 apart
    assert torch.equal(mod.cpu(q, w, 1e-6), mod.cpu(q.contiguous().view(20, 96), w, 1e-6).view(5, 4, 96))
    assert torch.allclose(mod.cpu(q, w, 1e-6).float(), mod.reference(q, w, 1e-6).float(), atol=mod.TOL[dtype])


def _poison_strided(kv: StridedKV, meta) -> StridedKV:
    """Huge stale values past each sequence's length, NaN past the longest (never to be read)."""
    k, v = (t.float() * (1 if s is None else s.unsqueeze(-1)) for t, s in ((kv.k, kv.k_scale), (kv.v, kv.v_scale)))
    k2, v2 = torch.full_like(k, 1e4), torch.full_like(v, 1e4)
    k2[:, meta.max_kv:], v2[:, meta.max_kv:] = float("nan"), float("nan")
    for s, n in zip(meta.seq_streams.tolist(), meta.kv_lens.tolist()):
        k2[s, :n], v2[s, :n] = k[s, :n], v[s, :n]
    return StridedKV(k2, v2)


def test_attention_reads_only_each_sequences_own_cells():
    """Stale values past a sequence's length (huge, they would dominate if not masked) and NaN
    past the longest sequence must not change the output."""
    mod = _kernel("attention")
    gen = torch.Generator().manual_seed(7)
    for _ in range(10):
        q, kv, meta, scale = mod.example_inputs(gen, torch.float32)
        clean = _poison_strided(kv, meta)  # dequantized copy: the same values as kv
        want = mod.reference(q, kv, meta, scale)
        got = mod.cpu(q, clean, meta, scale)
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


def test_paged_attention_reads_only_each_sequences_own_blocks():
    """Pages no sequence of the batch maps hold huge values: they must not leak into the output."""
    mod = _kernel("paged_attention")
    gen = torch.Generator().manual_seed(8)
    for _ in range(10):
        q, kv, meta, scale = mod.example_inputs(gen, torch.float32)
        want = mod.reference(q, kv, meta, scale)
        used = kv.block_table[kv.block_table >= 0].long()
        k2, v2 = torch.full_like(kv.k_pages, 1e4), torch.full_like(kv.v_pages, 1e4)
        k2[used], v2[used] = kv.k_pages[used], kv.v_pages[used]
        got = mod.cpu(q, PagedKV(k2, v2, kv.block_table, kv.block_size), meta, scale)
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


def test_paged_attention_equals_attention_on_the_same_cells():
    """The same K/V seen as pages (shuffled blocks) or as a flat strided cache: same output."""
    paged, flat = _kernel("paged_attention"), _kernel("attention")
    gen = torch.Generator().manual_seed(9)
    for _ in range(5):
        q, kv, meta, scale = paged.example_inputs(gen, torch.float32)
        streams, per_stream = kv.block_table.shape
        table = kv.block_table.long().clamp(min=0)
        k = kv.k_pages[table].reshape(streams, per_stream * kv.block_size, *kv.k_pages.shape[2:])
        v = kv.v_pages[table].reshape(streams, per_stream * kv.block_size, *kv.v_pages.shape[2:])
        torch.testing.assert_close(paged.cpu(q, kv, meta, scale), flat.cpu(q, StridedKV(k, v), meta, scale),
                                   atol=1e-5, rtol=1e-5)




def _first_seen(meta) -> list[int]:
    """Per sequence of the batch: the first cell its earliest query sees under the window."""
    return [max(0, n_kv - n_q - meta.window + 1) for n_kv, n_q in zip(meta.kv_lens.tolist(), meta.q_lens.tolist())]


def _poison_before_window(k: torch.Tensor, v: torch.Tensor, meta, cells_of, nan_below: int) -> None:
    """In place: 1e4 (it would dominate any score it entered) in each sequence's cells before its
    window, NaN in those below `nan_below` (no path may even read those: a masked read of NaN
    still spreads it)."""
    for s, first in zip(meta.seq_streams.tolist(), _first_seen(meta)):
        for c in range(first):
            k[cells_of(s, c)], v[cells_of(s, c)] = (float("nan"),) * 2 if c < nan_below else (1e4,) * 2


@pytest.mark.parametrize("op", ["attention", "paged_attention"])
def test_windowed_attention_skips_the_cells_before_the_window(op):
    """A sliding window (AttnMeta.window) is honoured by every CPU path (C decode, SDPA decode,
    per-chunk, padded, paged gather): huge values before a sequence's window change nothing, and
    the cells before all of the batch's windows (whole blocks of them, paged) are never read."""
    mod = _kernel(op)
    gen = torch.Generator().manual_seed(21)
    for _ in range(20):
        q, kv, meta, scale = mod.example_inputs(gen, torch.float32)
        meta = meta.with_layer(int(torch.randint(1, 12, (), generator=gen)), meta.softcap, meta.sinks)
        want = mod.reference(q, kv, meta, scale)
        if kv.paged:
            k, v, bs = kv.k_pages.clone(), kv.v_pages.clone(), kv.block_size
            _poison_before_window(k, v, meta, lambda s, c: (int(kv.block_table[s, c // bs]), c % bs),
                                  min(_first_seen(meta)) // bs * bs)
            got = mod.cpu(q, PagedKV(k, v, kv.block_table, bs), meta, scale)
        else:
            k, v = (t.float() * (1 if sc is None else sc.unsqueeze(-1)) for t, sc in ((kv.k, kv.k_scale), (kv.v, kv.v_scale)))
            _poison_before_window(k, v, meta, lambda s, c: (s, c), min(_first_seen(meta)))
            got = mod.cpu(q, StridedKV(k, v), meta, scale)
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


def test_windowed_decode_in_c_reads_only_each_sequences_window():
    """The C decode kernel starts each sequence at its own window: NaN in every cell before it."""
    mod = _kernel("attention")
    if mod._LIB is None:
        pytest.skip("no C compiler here (or SLOTSERVER_NATIVE=0)")
    gen, checked = torch.Generator().manual_seed(22), 0
    while checked < 8:
        q, kv, meta, scale = mod.example_inputs(gen, torch.float32)
        if meta.max_q != 1 or kv.k_scale is not None:
            continue
        meta = meta.with_layer(int(torch.randint(1, 12, (), generator=gen)), meta.softcap, meta.sinks)
        want = mod.reference(q, kv, meta, scale)
        k, v = kv.k.clone(), kv.v.clone()
        for s, first in zip(meta.seq_streams.tolist(), _first_seen(meta)):
            k[s, :first], v[s, :first] = float("nan"), float("nan")
        torch.testing.assert_close(mod.cpu(q, StridedKV(k, v), meta, scale), want, atol=1e-4, rtol=1e-4)
        checked += 1
