"""Paged KV under CUDA graphs (runtime/paged_blocks.py `graph_step`): a decode step's cells are
placed on the host before the step, into buffers a captured write reads. On the CPU: the K/V a
step writes that way are the ones the plain write stores (block boundaries, copy-on-write and the
pool's growth included), and the buffers a replay would read keep their address from step to step.
The replays themselves run in tests/test_device.py on a CUDA machine."""

from __future__ import annotations

import pytest
import torch

from slotserver.runtime.kv_spec import KVSpec
from slotserver.runtime.layouts import create_layout, load_layout

SPEC = KVSpec(n_layers=2, n_streams=3, n_cells=64, n_kv_heads=2, head_dim=8)


def _steps(layout, pinned: bool, gen: torch.Generator) -> None:
    """A prompt on streams 0 and 1, stream 0's prefix shared into 2, then decode steps across
    block boundaries (16 cells a block) on all three streams: the graph_step form or the plain one."""
    def write(streams, positions, graph: bool):
        n = len(streams)
        s, p = torch.tensor(streams), torch.tensor(positions)
        kv = [(torch.randn(n, 2, 8, generator=gen), torch.randn(n, 2, 8, generator=gen)) for _ in range(2)]
        if graph:
            with layout.graph_step(s, p):
                for layer, (k, v) in enumerate(kv):
                    layout.write(layer, s, p, k, v)
        else:
            for layer, (k, v) in enumerate(kv):
                layout.write(layer, s, p, k, v)

    write([0] * 14 + [1] * 14, list(range(14)) * 2, graph=False)   # prefill: always the plain write
    layout.copy_stream(0, 2, 10)                                   # shared block: copy-on-write next
    for i in range(40):                                            # 14 .. 53: blocks 1, 2 and 3 allocated
        write([0, 1, 2], [14 + i, 14 + i, 10 + i], graph=pinned)


@pytest.mark.parametrize("name", ["paged", "paged_hnd"])
def test_a_graph_step_writes_what_the_plain_write_writes(name):
    caches = {}
    for pinned in (False, True):
        layout = create_layout(load_layout(name), SPEC)
        _steps(layout, pinned, torch.Generator().manual_seed(5))
        layout.check()
        caches[pinned] = [layout.export_stream(s, n) for s, n in ((0, 54), (1, 54), (2, 50))]
    for (k0, v0), (k1, v1) in zip(caches[False], caches[True]):
        assert torch.equal(k0, k1) and torch.equal(v0, v1)


def test_the_buffers_a_replay_reads_keep_their_address():
    """The (block, row) buffer and the block table's device copy: one tensor each, refreshed in
    place, while the steps' cells move to new blocks; outside a graph step a write places its own."""
    layout = create_layout(load_layout("paged"), SPEC)
    s = torch.tensor([0, 1])
    ptrs, tables = set(), set()
    for pos in (15, 16, 17, 33):
        p = torch.tensor([pos, pos])
        with layout.graph_step(s, p):
            blocks, rows = layout._place(s, p)
            ptrs.add((blocks.data_ptr(), rows.data_ptr()))
            tables.add(id(layout.view(0).block_table))
            assert rows.tolist() == [pos % 16] * 2
            assert blocks.tolist() == layout.blocks.table[s, pos // 16].tolist()
    assert len(ptrs) == 1 and len(tables) == 1
    assert layout._pinned is None and layout._place(s, torch.tensor([1, 1]))[0].data_ptr() not in {p[0] for p in ptrs}


def test_the_block_tables_device_copy_is_refreshed_in_place():
    """Off the CPU the table's device copy is another tensor (here on torch's meta device, which
    has shapes and no data): the same object after an edit, no new one a graph would miss."""
    from slotserver.runtime.paged_blocks import BlockTable

    table = BlockTable(n_streams=2, n_cells=64, block_size=16, max_blocks=8, device="meta")
    table.alloc.reserve(8)
    first = table.device_table()
    assert first.device.type == "meta" and first.shape == (2, 4)
    table.prepare_write(torch.tensor([0, 1]), torch.tensor([0, 20]))   # an edit: version moves on
    assert table.device_table() is first
