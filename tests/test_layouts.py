"""Every layout in layouts/ keeps the layout contract: rows written are read back through the
attention view, stream copy moves a prefix, export/import round-trips in canonical form, within a
per-layout tolerance (q8 is lossy). Plus what each layout promises on top: head_seq_dim hands out
a strided view of heads-first storage; a layout whose view is paged keeps the paged contract
(`PagedLayout`) and is refused when it lacks part of it; paged defrag moves no data,
copy-on-write keeps streams apart, and no block ever leaks."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from slotserver.runtime.batch import Batch, SeqChunk
from slotserver.runtime.kernel_set import KERNEL_CONTRACT
from slotserver.runtime.kv_spec import KVSpec, StridedKV
from slotserver.runtime.layouts import available_layouts, create_layout, load_layout
from slotserver.runtime.loader import ModuleLoadError, default_dir, load_by_path
from slotserver.runtime.paged_contract import PagedLayout, is_paged

SPEC = KVSpec(n_layers=3, n_streams=5, n_cells=17, n_kv_heads=2, head_dim=8)
LAYOUTS = available_layouts()
PAGED = [name for name in LAYOUTS if name.startswith("paged")]
# A lossy layout states its read-back tolerance as a module-level TOL (relative to the values'
# magnitude); q8: one scale per row, error <= half a step = absmax / 254 (~0.4% of absmax).
TOL = {name: getattr(load_layout(name).module, "TOL", 0.0) for name in LAYOUTS}


def _make(name: str, spec: KVSpec = SPEC, **kwargs):
    if kwargs:
        return load_layout(name).module.create(spec, **kwargs)
    return create_layout(load_layout(name), spec)


def _rows(n: int, seed: int, spec: KVSpec = SPEC) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(n, spec.n_kv_heads, spec.head_dim, generator=gen),
            torch.randn(n, spec.n_kv_heads, spec.head_dim, generator=gen))


def _close(name: str, got: torch.Tensor, want: torch.Tensor) -> None:
    tol = 1e-6 + TOL[name] * float(want.abs().max())
    torch.testing.assert_close(got.float(), want.float(), atol=tol, rtol=0)


def _logical(view) -> tuple[torch.Tensor, torch.Tensor]:
    """Any view as float `[stream, cell, kv_head, head_dim]` (pages gathered, q8 dequantized)."""
    if view.paged:
        table = view.block_table.long().clamp(min=0)                 # unmapped cells read block 0
        n_streams, per_stream = table.shape
        k, v = (p[table].reshape(n_streams, per_stream * view.block_size, *p.shape[2:])
                for p in (view.k_pages, view.v_pages))
        mapped = (view.block_table >= 0).repeat_interleave(view.block_size, dim=1)[..., None, None]
        return torch.where(mapped, k, 0).float(), torch.where(mapped, v, 0).float()
    if view.k_scale is not None:
        return view.k.float() * view.k_scale.unsqueeze(-1), view.v.float() * view.v_scale.unsqueeze(-1)
    return view.k.float(), view.v.float()


@pytest.mark.parametrize("name", LAYOUTS)
def test_write_then_view(name):
    lay = _make(name)
    streams, positions = torch.tensor([4, 0, 4, 2]), torch.tensor([0, 16, 1, 7])
    k, v = _rows(4, 0)
    lay.write(1, streams, positions, k, v)
    vk, vv = _logical(lay.view(1))
    assert vk.shape[0] == SPEC.n_streams and vk.shape[1] >= SPEC.n_cells and vk.shape[2:] == k.shape[1:]
    for t in range(4):
        _close(name, vk[streams[t], positions[t]], k[t])
        _close(name, vv[streams[t], positions[t]], v[t])
    assert not _logical(lay.view(0))[0].any(), "a write to layer 1 must not touch layer 0"


@pytest.mark.parametrize("name", LAYOUTS)
def test_copy_stream_and_export_import_round_trip(name):
    lay = _make(name)
    n = 6
    k, v = _rows(n, 1)
    for layer in range(SPEC.n_layers):
        lay.write(layer, torch.full((n,), 3), torch.arange(n), k + layer, v - layer)
    lay.copy_stream(3, 1, n)
    ek, ev = lay.export_stream(1, n)
    assert ek.shape == (SPEC.n_layers, n, SPEC.n_kv_heads, SPEC.head_dim) and ek.dtype == SPEC.dtype
    for layer in range(SPEC.n_layers):
        _close(name, ek[layer], k + layer)
        _close(name, ev[layer], v - layer)
    other = _make(name)
    other.import_stream(0, ek, ev)
    _close(name, other.export_stream(0, n)[0], ek)
    full = SPEC.n_streams * SPEC.n_cells * SPEC.bytes_per_cell
    assert full // 4 <= lay.bytes_used() <= 2 * full, "bytes_used must count the K/V storage"


@pytest.mark.parametrize("name", LAYOUTS)
def test_writes_after_a_copy_stay_in_their_own_stream(name):
    """The defrag move then new tokens on both sides: neither stream sees the other's writes."""
    lay = _make(name)
    k, v = _rows(10, 2)
    lay.write(0, torch.full((10,), 0), torch.arange(10), k, v)
    lay.copy_stream(0, 2, 10)
    k_src, v_src = _rows(3, 3)
    k_dst, v_dst = _rows(3, 4)
    lay.write(0, torch.tensor([0, 0, 2]), torch.tensor([3, 10, 10]), k_src, v_src)   # src rewrites a shared cell
    lay.write(0, torch.tensor([2, 2, 2]), torch.tensor([4, 11, 0]), k_dst, v_dst)
    src, dst = lay.export_stream(0, 11)[0][0], lay.export_stream(2, 12)[0][0]        # layer 0 [cells, H, D]
    _close(name, src, torch.cat([k[:3], k_src[:1], k[4:10], k_src[1:2]]))
    _close(name, dst, torch.cat([k_dst[2:], k[1:4], k_dst[:1], k[5:10], k_src[2:], k_dst[1:2]]))


@pytest.mark.parametrize("name", LAYOUTS)
def test_attention_over_the_view_equals_attention_over_the_exported_cache(name):
    """What the model does each step: write, then attend through `view`; any layout, same answer."""
    lay = _make(name)
    k, v = _rows(12, 5)
    streams = torch.tensor([1] * 7 + [4] * 5)
    positions = torch.cat([torch.arange(7), torch.arange(5)])
    lay.write(2, streams, positions, k, v)
    meta = Batch.build([SeqChunk(4, 2, [0] * 3), SeqChunk(1, 6, [0])]).attn
    q = torch.randn(4, 4, SPEC.head_dim, generator=torch.Generator().manual_seed(6))
    kernels = default_dir("kernels")
    view = lay.view(2)
    op = load_by_path(kernels / f"{'paged_' if view.paged else ''}attention.py", KERNEL_CONTRACT).module
    exported = [lay.export_stream(s, SPEC.n_cells) for s in range(SPEC.n_streams)]
    flat = StridedKV(torch.stack([e[0][2] for e in exported]), torch.stack([e[1][2] for e in exported]))
    want = load_by_path(kernels / "attention.py", KERNEL_CONTRACT).module.reference(q, flat, meta, 0.3)
    torch.testing.assert_close(op.cpu(q, view, meta, 0.3), want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", LAYOUTS)
def test_index_tensors_refilled_in_place_between_steps(name):
    """An engine may reuse its index buffers (refilled in place, under inference_mode, as the model
    runs): every step's rows must land at that step's positions, in every layer."""
    lay = _make(name)
    k, v = _rows(6, 13)
    with torch.inference_mode():
        streams, positions = torch.tensor([1, 1, 3]), torch.arange(3)
        for step in range(2):
            for layer in range(SPEC.n_layers):
                lay.write(layer, streams, positions, k[3 * step: 3 * step + 3], v[3 * step: 3 * step + 3])
            positions += 3
    want = torch.stack([k[0], k[1], torch.zeros_like(k[0]), k[3], k[4]])  # cell 2 never written
    _close(name, lay.export_stream(1, 5)[0][2], want)
    _close(name, lay.export_stream(3, 6)[0][2][[2, 5]], k[[2, 5]])


@pytest.mark.parametrize("name", LAYOUTS)
def test_a_paged_view_comes_with_the_paged_contract(name):
    """What the engine relies on, through the Protocol's members only: a paged layout's blocks hold
    `block_size` cells, its pool holds at least one full stream, `trim_stream` keeps the blocks of
    the first n cells and `free_stream` gives back the rest. A flat layout has none of it."""
    lay = _make(name)
    if not is_paged(lay):
        assert not isinstance(lay, PagedLayout), "a flat layout would be trimmed as if paged"
        return
    assert isinstance(lay, PagedLayout)
    size = lay.block_size
    assert lay.view(0).block_size == size and lay.max_blocks * size >= SPEC.n_cells
    k, v = _rows(SPEC.n_cells, 14)
    for s in (1, 2):
        lay.write(0, torch.full((SPEC.n_cells,), s), torch.arange(SPEC.n_cells), k, v)
    lay.trim_stream(1, 1)     # keeps the first block only
    lay.free_stream(2)
    kept = lay.export_stream(1, SPEC.n_cells)[0][0]
    _close(name, kept[:size], k[:size])
    assert not kept[size:].any() and not lay.export_stream(2, SPEC.n_cells)[0].any()


def test_a_paged_layout_missing_part_of_the_paged_contract_is_refused(tmp_path):
    """A lab edit that drops `free_stream` from a paged layout fails at load, naming the member."""
    src = (default_dir("layouts") / "paged.py").read_text()
    edited = src.replace('    name = NAME\n', '    name = NAME\n    free_stream = None\n')
    assert edited != src
    (tmp_path / "paged.py").write_text(edited)
    with pytest.raises(ModuleLoadError, match="view is paged.*lacks free_stream.*PagedLayout"):
        create_layout(load_layout("paged", tmp_path), SPEC)


def test_head_seq_dim_view_is_a_strided_view_of_heads_first_storage():
    lay = _make("head_seq_dim")
    view = lay.view(1)
    assert isinstance(view, StridedKV) and not view.k.is_contiguous()
    assert view.k.shape == (SPEC.n_streams, SPEC.n_cells, SPEC.n_kv_heads, SPEC.head_dim)
    # one head's cells are contiguous rows: cell stride head_dim, head stride n_cells * head_dim
    assert view.k.stride()[1:] == (SPEC.head_dim, SPEC.n_cells * SPEC.head_dim, 1)
    k, v = _rows(1, 7)
    lay.write(1, torch.tensor([3]), torch.tensor([5]), k, v)
    assert view.k.data_ptr() == lay.view(1).k.data_ptr(), "the view aliases the storage, no copy"
    torch.testing.assert_close(view.k[3, 5], k[0])


@pytest.mark.parametrize("name", PAGED)
def test_paged_copy_stream_moves_no_data(name):
    lay = _make(name)
    k, v = _rows(17, 8)
    lay.write(0, torch.full((17,), 1), torch.arange(17), k, v)
    before = (lay.k_store.clone(), lay.v_store.clone(), lay.blocks.alloc.n_free)
    lay.copy_stream(1, 3, 17)
    assert torch.equal(lay.k_store, before[0]) and torch.equal(lay.v_store, before[1])
    assert lay.blocks.alloc.n_free == before[2], "a move must not allocate"
    assert torch.equal(lay.blocks.table[3], lay.blocks.table[1]), "dst maps src's blocks"
    lay.free_stream(1)  # the engine abandons the source: dst now owns the blocks alone
    lay.write(0, torch.tensor([3]), torch.tensor([17 - 1]), *_rows(1, 9))
    assert lay.blocks.alloc.n_free == before[2], "no copy-on-write once the source is freed"
    _close(name, lay.export_stream(3, 16)[0][0], k[:16])
    lay.check()


@pytest.mark.parametrize("name", PAGED)
def test_paged_memory_follows_tokens_and_every_stream_can_fill_up(name):
    spec = KVSpec(n_layers=1, n_streams=3, n_cells=20, n_kv_heads=1, head_dim=4)
    lay = _make(name, spec, block_size=4)
    assert lay.view(0).block_size == 4 and lay.max_blocks * 4 >= spec.n_streams * spec.n_cells
    lay.write(0, torch.zeros(9, dtype=torch.long), torch.arange(9), *_rows(9, 10, spec))
    assert lay.blocks.n_blocks - lay.blocks.alloc.n_free == 3, "9 cells = 3 blocks of 4"
    for s in range(spec.n_streams):
        lay.write(0, torch.full((20,), s), torch.arange(20), *_rows(20, 11 + s, spec))
    assert lay.blocks.alloc.n_free == 0
    lay.free_stream(1)
    assert lay.blocks.alloc.n_free == 5
    lay.check()


OPS = st.one_of(
    st.tuples(st.just("write"), st.integers(0, 3), st.integers(0, 12), st.integers(1, 6)),
    st.tuples(st.just("copy"), st.integers(0, 3), st.integers(0, 3), st.integers(0, 13)),
    st.tuples(st.just("free"), st.integers(0, 3)),
    st.tuples(st.just("import"), st.integers(0, 3), st.integers(1, 13)),
)


@pytest.mark.parametrize("name", PAGED)
@settings(max_examples=40, deadline=None)
@given(ops=st.lists(OPS, max_size=25), block_size=st.sampled_from([1, 2, 4, 16]))
def test_paged_random_writes_copies_frees_keep_data_and_never_leak(name, ops, block_size):
    """Against a plain dict of what each stream should hold: data survives any interleaving of
    writes, copies (shared blocks, copy-on-write) and frees; refcounts match the tables after
    every step; once every stream is freed, every block is back on the free list."""
    spec = KVSpec(n_layers=2, n_streams=4, n_cells=13, n_kv_heads=1, head_dim=2)
    lay, shadow = _make(name, spec, block_size=block_size), [dict() for _ in range(4)]
    for i, (op, *args) in enumerate(ops):
        value = float(i + 1)
        if op == "write":
            s, start, n = args
            pos = torch.arange(start, min(start + n, spec.n_cells))
            streams = torch.full_like(pos, s)
            for layer in range(spec.n_layers):  # like the model: same index tensors for every layer
                rows = (value + pos.float() / 100 + layer).view(-1, 1, 1).expand(-1, 1, 2)
                lay.write(layer, streams, pos, rows, -rows)
            shadow[s].update({int(p): value + int(p) / 100 for p in pos})
        elif op == "copy" and args[0] != args[1]:
            src, dst, n = args
            lay.copy_stream(src, dst, n)
            shadow[dst] = {p: x for p, x in shadow[src].items() if p < n}
        elif op == "free":
            lay.free_stream(args[0])
            shadow[args[0]] = {}
        elif op == "import":
            s, n = args
            rows = (value + torch.arange(n).float() / 100).view(1, n, 1, 1) + torch.arange(2.0).view(2, 1, 1, 1)
            lay.import_stream(s, rows.expand(-1, -1, 1, 2), -rows.expand(-1, -1, 1, 2))
            shadow[s].update({p: value + p / 100 for p in range(n)})
        lay.check()
    for s in range(4):
        ek, ev = lay.export_stream(s, spec.n_cells)
        for p, x in shadow[s].items():
            assert ek[1, p, 0, 0] == pytest.approx(x + 1) and ev[0, p, 0, 1] == pytest.approx(-x)
        lay.free_stream(s)
    lay.check()
    assert lay.blocks.alloc.n_free == lay.blocks.n_blocks, "blocks leaked"


def test_q8_stores_int8_with_a_scale_per_row():
    """head_dim bytes + one float32 scale per row instead of 4 * head_dim bytes (float32)."""
    lay, flat = _make("q8"), _make("seq_head_dim")
    k, v = _rows(17, 12)
    k[3, 1] = 0  # an all-zero row must come back as zeros, not NaN
    lay.write(0, torch.full((17,), 2), torch.arange(17), k, v)
    view = lay.view(0)
    assert view.k.dtype == torch.int8 and view.k_scale.shape == view.k.shape[:3]
    ek = lay.export_stream(2, 17)[0][0]
    step = k.abs().amax(dim=-1, keepdim=True) / 127                     # one int8 step per row
    assert torch.all((ek - k).abs() <= step / 2 + 1e-6) and not ek.isnan().any()
    assert 0 < (ek - k).abs().max(), "q8 is lossy: an exact read-back means nothing was quantized"
    d = SPEC.head_dim
    assert lay.bytes_used() == flat.bytes_used() * (d + 4) // (4 * d)


def _rss_mib() -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) / 1024


@pytest.mark.parametrize("name", ["seq_head_dim", "head_seq_dim", "q8"])
def test_flat_kv_memory_is_resident_only_where_written(name):
    """A flat layout's whole `-c` is allocated up front, yet memory follows the cells written (as
    llama-server users see RSS grow with use, not with -c): 256 MiB of K/V cost almost nothing
    until written, read as zeros, and writing one stream's first cells makes only those resident."""
    spec = KVSpec(n_layers=16, n_streams=8, n_cells=4096, n_kv_heads=2, head_dim=64, dtype=torch.float16)
    before = _rss_mib()
    layout = _make(name, spec)
    assert _rss_mib() - before < 16
    view = layout.view(3)
    assert float(view.k[5, :64].float().abs().max()) == 0.0
    k, v = (t.to(spec.dtype) for t in _rows(100, 4, spec))
    for layer in range(spec.n_layers):
        layout.write(layer, torch.full((100,), 2), torch.arange(100), k, v)
    assert _rss_mib() - before < 32
    _close(name, _logical(layout.view(7))[0][2, :100], k)
