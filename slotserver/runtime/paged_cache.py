"""`PagedKVCache`: the layout contract of paged KV layouts (layouts/paged.py, layouts/paged_hnd.py) on
top of the block pool and tables of paged_blocks.py, for any order of rows inside a block.

Why apart: paged_blocks.py is the bookkeeping (which block and row a cell lives in, refcounts,
copy-on-write, compaction) and never touches K/V data; this is the data side (the pool tensors,
their growth and shrinking, writes, views, stream copies, slot export/import, CUDA-graph steps).
"""

from __future__ import annotations

import contextlib

import torch

from slotserver.runtime.paged_blocks import MIN_BLOCKS, BlockTable


class PagedKVCache:
    """The layout contract and the paged contract (`PagedLayout`: block_size, max_blocks,
    trim_stream, free_stream) on top of a `BlockTable`, for any order of rows inside a block.

    Subclasses (the layout modules) only choose the storage: `make_pages(shape)` returns one pool
    tensor and its logical `[n_layers, n_blocks, block_size, kv_heads, head_dim]` view (e.g. a
    permutation of a heads-first storage). Every write goes through the view, so one code path
    serves every storage order, and so does the pool's reallocation when it grows or shrinks.
    `max_blocks` is the pool's limit: `ceil(spec.pool_cells / block_size)`, or every stream full.
    """

    name = "paged"

    def __init__(self, spec, block_size: int) -> None:
        self.spec = spec
        per_stream = -(-spec.n_cells // block_size)
        cells = spec.pool_cells if spec.pool_cells is not None else spec.n_streams * per_stream * block_size
        max_blocks = -(-cells // block_size)
        if max_blocks < per_stream:
            raise ValueError(f"a KV pool of {cells} cells cannot hold one full stream of {spec.n_cells}")
        self.blocks = BlockTable(spec.n_streams, spec.n_cells, block_size, max_blocks, spec.device)
        self.k_store = self.v_store = self.k = self.v = None
        self._resize(min(MIN_BLOCKS, max_blocks))  # block 0 always exists: kernels clamp -1 to it
        self._memo: tuple | None = None  # (streams, positions, table version, blocks, rows)
        self._pinned: tuple | None = None  # graph_step's (streams, positions, blocks, rows)
        self._step_cells: torch.Tensor | None = None   # [2, n_streams] int64: a graph step's blocks, rows

    @contextlib.contextmanager
    def graph_step(self, streams: torch.Tensor, positions: torch.Tensor):
        """Inside: a decode step captured or replayed as a CUDA graph (model/cuda_graph.py) writes
        these cells. Placed here first, on the host (blocks allocated, copied on write, the pool
        grown: what a replay cannot run), and their (block, row) put into one persistent device
        buffer, as the block table's device copy is: a captured write reads them from there.
        `write` given these very tensors uses that buffer; a decode step has at most one row a
        stream, so the buffer is sized once for n_streams rows."""
        blocks, rows = self._place(streams, positions)
        n = blocks.shape[0]
        if self._step_cells is None:
            self._step_cells = torch.zeros((2, self.spec.n_streams), dtype=torch.int64, device=self.spec.device)
        assert n <= self._step_cells.shape[1], f"a graph step of {n} rows, more than {self._step_cells.shape[1]} streams"
        self._step_cells[0, :n].copy_(blocks)
        self._step_cells[1, :n].copy_(rows)
        self.blocks.device_table()                                # refreshed in place before a replay reads it
        self._pinned = (streams, positions, self._step_cells[0, :n], self._step_cells[1, :n])
        try:
            yield
        finally:
            self._pinned = None

    def make_pages(self, shape: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError

    @property
    def block_size(self) -> int:
        return self.blocks.block_size

    @property
    def max_blocks(self) -> int:
        return self.blocks.alloc.max_blocks

    def write(self, layer: int, streams: torch.Tensor, positions: torch.Tensor,
              k: torch.Tensor, v: torch.Tensor) -> None:
        """Store rows `k[t]`, `v[t]` (`[tokens, kv_heads, head_dim]`) at (streams[t], positions[t]).

        Blocks are allocated (and shared ones copied) on the first layer's write of a batch; the
        other layers reuse that placement (memoised on the very same index tensors)."""
        blocks, rows = self._place(streams, positions)
        self.k[layer].index_put_((blocks, rows), k.to(self.spec.dtype))
        self.v[layer].index_put_((blocks, rows), v.to(self.spec.dtype))

    def view(self, layer: int):
        from slotserver.runtime.kv_spec import PagedKV

        return PagedKV(self.k[layer], self.v[layer], self.blocks.device_table(), self.block_size)

    def copy_stream(self, src: int, dst: int, n: int) -> None:
        """`dst`'s first `n` cells become `src`'s: a block-table edit, no K/V data moves.

        Blocks are shared (refcounted) until either stream writes into one (copy-on-write), so a
        later write to either stream never shows in the other. `dst`'s cells past `n` are dropped.
        The engine may abandon or free `src` afterwards (`free_stream`): then `dst` owns the blocks
        alone and nothing is ever copied."""
        assert 0 <= n <= self.spec.n_cells and src != dst
        self.blocks.share_prefix(src, dst, n)

    def free_stream(self, stream: int) -> None:
        """Return the stream's blocks to the free list (shared ones stay with their other owners)."""
        self.trim_stream(stream, 0)

    def trim_stream(self, stream: int, n: int) -> None:
        """Keep only the blocks holding the stream's first `n` cells; the pool may shrink after."""
        self.blocks.trim_stream(stream, n)
        self._maybe_shrink()

    def export_stream(self, stream: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Canonical copy of the first `n` cells, `[n_layers, n, kv_heads, head_dim]`; zeros where
        a cell was never written."""
        assert 0 <= n <= self.spec.n_cells
        cells = torch.arange(n)
        blocks, rows = self.blocks.locate(torch.full((n,), stream), cells)
        mapped = (blocks >= 0).view(1, n, 1, 1).to(self.spec.device)
        blocks, rows = blocks.clamp(min=0).to(self.spec.device), rows.to(self.spec.device)
        k = self.k[:, blocks, rows]                               # [n_layers, n, kv_heads, head_dim]
        v = self.v[:, blocks, rows]
        return torch.where(mapped, k, 0), torch.where(mapped, v, 0)

    def import_stream(self, stream: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """Inverse of `export_stream`: write canonical K/V into the first cells of `stream`."""
        n = k.shape[1]
        assert k.shape == v.shape == (self.spec.n_layers, n, self.spec.n_kv_heads, self.spec.head_dim)
        assert n <= self.spec.n_cells
        streams = torch.full((n,), stream, device=self.spec.device)
        blocks, rows = self._place(streams, torch.arange(n, device=self.spec.device))
        self.k[:, blocks, rows] = k.to(self.spec.dtype)
        self.v[:, blocks, rows] = v.to(self.spec.dtype)

    def bytes_used(self) -> int:
        """Bytes allocated now: the pool at its current capacity plus the block table."""
        pools = sum(t.numel() * t.element_size() for t in (self.k_store, self.v_store))
        return pools + self.blocks.table.numel() * self.blocks.table.element_size()

    def check(self) -> None:
        """Assert the allocator and table invariants (tests call this)."""
        self.blocks.check()
        assert self.k.shape[1] == self.v.shape[1] == self.blocks.n_blocks, "pool tensor != capacity"

    def _place(self, streams: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(block, row) of each written cell, growing the pool and allocating / copying-on-write
        first. Memoised on the index values and the table version, so the other layers of a forward
        skip the bookkeeping (compared by value: a caller may refill the same index tensors)."""
        pinned = self._pinned
        if pinned is not None and streams is pinned[0] and positions is pinned[1]:
            return pinned[2], pinned[3]           # graph_step placed them (no host work: capturable)
        memo = self._memo
        if (memo and memo[2] == self.blocks.version and memo[0].shape == streams.shape
                and torch.equal(memo[0], streams) and torch.equal(memo[1], positions)):
            return memo[3], memo[4]
        alloc = self.blocks.alloc
        need = self.blocks.blocks_needed(streams, positions)
        if need > alloc.n_free:  # double (amortised), at least what this write needs, at most the max
            self._resize(min(alloc.max_blocks, max(2 * alloc.capacity, alloc.n_used + need)))
        for old, new in self.blocks.prepare_write(streams, positions):
            self.k[:, new] = self.k[:, old]  # copy-on-write: every layer of the shared block
            self.v[:, new] = self.v[:, old]
        blocks, rows = self.blocks.locate(streams, positions)
        self._memo = (streams.clone(), positions.clone(), self.blocks.version, blocks, rows)
        return blocks, rows

    def _maybe_shrink(self) -> None:
        """At most a quarter used: move the used blocks down and release the top (to twice the use)."""
        alloc = self.blocks.alloc
        target = max(MIN_BLOCKS, 2 * alloc.n_used)
        if alloc.capacity <= MIN_BLOCKS or 4 * alloc.n_used > alloc.capacity or target >= alloc.capacity:
            return
        moves = self.blocks.compact(target)
        if moves:
            old, new = (torch.tensor(m, device=self.spec.device) for m in zip(*moves))
            self.k[:, new] = self.k[:, old]
            self.v[:, new] = self.v[:, old]
        self._resize(target)

    def _resize(self, capacity: int) -> None:
        """Reallocate the pool tensors at `capacity` blocks, keeping blocks below both sizes.

        Made outside inference mode even when the model's forward grows the pool: inference
        tensors could not be edited in place later (a trim's compaction, an import)."""
        alloc, s = self.blocks.alloc, self.spec
        shape = (s.n_layers, capacity, self.block_size, s.n_kv_heads, s.head_dim)
        with torch.inference_mode(False):
            k_store, k = self.make_pages(shape)
            v_store, v = self.make_pages(shape)
            if self.k is not None:
                keep = min(capacity, self.k.shape[1])
                k[:, :keep], v[:, :keep] = self.k[:, :keep], self.v[:, :keep]
        self.k_store, self.k, self.v_store, self.v = k_store, k, v_store, v
        if capacity >= alloc.capacity:
            alloc.reserve(capacity)
        else:
            alloc.release(capacity)
