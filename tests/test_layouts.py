"""Every layout in layouts/ keeps the layout contract: rows written are read back through the
attention view, stream copy moves a prefix, export/import round-trips in canonical form."""

from __future__ import annotations

import pytest
import torch

from slotserver.kv_spec import KVSpec
from slotserver.layout_loader import available_layouts, create_layout, load_layout

SPEC = KVSpec(n_layers=3, n_streams=5, n_cells=17, n_kv_heads=2, head_dim=8)


def _make(name: str, spec: KVSpec = SPEC):
    return create_layout(load_layout(name), spec)


def _rows(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(n, SPEC.n_kv_heads, SPEC.head_dim, generator=gen),
            torch.randn(n, SPEC.n_kv_heads, SPEC.head_dim, generator=gen))


@pytest.mark.parametrize("name", available_layouts())
def test_write_then_view(name):
    lay = _make(name)
    streams, positions = torch.tensor([4, 0, 4, 2]), torch.tensor([0, 16, 1, 7])
    k, v = _rows(4, 0)
    lay.write(1, streams, positions, k, v)
    view = lay.view(1)
    assert view.k.shape == (SPEC.n_streams, SPEC.n_cells, SPEC.n_kv_heads, SPEC.head_dim)
    for t in range(4):
        torch.testing.assert_close(view.k[streams[t], positions[t]], k[t])
        torch.testing.assert_close(view.v[streams[t], positions[t]], v[t])
    assert not lay.view(0).k.any(), "a write to layer 1 must not touch layer 0"


@pytest.mark.parametrize("name", available_layouts())
def test_copy_stream_and_export_import_round_trip(name):
    lay = _make(name)
    n = 6
    k, v = _rows(n, 1)
    for layer in range(SPEC.n_layers):
        lay.write(layer, torch.full((n,), 3), torch.arange(n), k + layer, v - layer)
    lay.copy_stream(3, 1, n)
    ek, ev = lay.export_stream(1, n)
    assert ek.shape == (SPEC.n_layers, n, SPEC.n_kv_heads, SPEC.head_dim)
    for layer in range(SPEC.n_layers):
        torch.testing.assert_close(ek[layer], k + layer)
        torch.testing.assert_close(ev[layer], v - layer)
    other = _make(name)
    other.import_stream(0, ek, ev)
    torch.testing.assert_close(other.export_stream(0, n)[0], ek)
    full = SPEC.n_streams * SPEC.n_cells * SPEC.bytes_per_cell
    assert full // 4 <= lay.bytes_used() <= 2 * full, "bytes_used must count the K/V storage"
