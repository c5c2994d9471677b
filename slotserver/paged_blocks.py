"""The shared machinery of paged KV layouts (vLLM style): a refcounted block pool, per-stream
block tables, and `PagedKVCache`, the layout contract on top of them.

Paged layouts (`layouts/paged.py`, `layouts/paged_hnd.py`) differ only in how a block stores its
rows; both keep their K/V pages in a pool of `n_blocks` blocks of `block_size` cells, and find cell
`c` of stream `s` at row `c % block_size` of block `table[s, c // block_size]`. `BlockAllocator`
and `BlockTable` own that mapping and never touch K/V data: they tell the cache which (block, row)
to write and which blocks to copy first (copy-on-write). A layout module subclasses `PagedKVCache`
and only chooses the storage order.

Why refcounts: the defrag move (`copy_stream`) must be a table edit, not a data copy. Sharing a
block between two streams is only safe if neither can write into it while shared, so `prepare_write`
gives a writer its own copy of a shared block first (copy-on-write). A block goes back to the free
list when its last reference is dropped.

Why the pool never runs out: every used block is mapped by at least one table entry, and the pool
holds as many blocks as the tables have entries (`n_streams * blocks_per_stream`). A new entry
needs one block while entries < capacity; a copy-on-write needs one while the shared block it
replaces is mapped twice, so used blocks < entries there too.
"""

from __future__ import annotations

import torch


class BlockAllocator:
    """A pool of block ids with reference counts. Verbs come in pairs: `can_allocate`/`allocate`
    hand out a fresh block (refcount 1), `share` adds a reference, `free` drops one."""

    def __init__(self, n_blocks: int) -> None:
        assert n_blocks > 0
        self.n_blocks = n_blocks
        self.refcount = [0] * n_blocks
        self.free_list = list(range(n_blocks - 1, -1, -1))  # pop() hands out the lowest id first

    @property
    def n_free(self) -> int:
        return len(self.free_list)

    def can_allocate(self, n: int = 1) -> bool:
        return len(self.free_list) >= n

    def allocate(self) -> int:
        assert self.can_allocate(), "block pool exhausted (more table entries than blocks?)"
        block = self.free_list.pop()
        assert self.refcount[block] == 0, f"free block {block} still referenced"
        self.refcount[block] = 1
        return block

    def share(self, block: int) -> None:
        assert self.refcount[block] > 0, f"sharing unallocated block {block}"
        self.refcount[block] += 1

    def free(self, block: int) -> None:
        assert self.refcount[block] > 0, f"double free of block {block}"
        self.refcount[block] -= 1
        if self.refcount[block] == 0:
            self.free_list.append(block)

    def is_shared(self, block: int) -> bool:
        return self.refcount[block] > 1

    def check(self) -> None:
        """Invariants: a block is free (refcount 0, on the free list exactly once) or used, never both."""
        assert len(set(self.free_list)) == len(self.free_list), "a block is on the free list twice"
        free = set(self.free_list)
        for block, ref in enumerate(self.refcount):
            assert ref >= 0, f"block {block} has refcount {ref}"
            assert (ref == 0) == (block in free), f"block {block}: refcount {ref}, on free list {block in free}"


class BlockTable:
    """Which block holds each stream's cells. `-1` marks an unmapped entry (never written, or freed).

    The table lives on the CPU (bookkeeping is scalar work); `device_table()` is the copy the
    attention kernels read, rebuilt only after an edit (`version` counts edits).
    """

    def __init__(self, n_streams: int, n_cells: int, block_size: int, device: str | torch.device = "cpu") -> None:
        assert block_size > 0
        self.block_size = block_size
        self.blocks_per_stream = -(-n_cells // block_size)
        self.alloc = BlockAllocator(n_streams * self.blocks_per_stream)
        self.table = torch.full((n_streams, self.blocks_per_stream), -1, dtype=torch.int32)
        self.device = device
        self.version = 0
        self._device_table: tuple[int, torch.Tensor] | None = None

    @property
    def n_blocks(self) -> int:
        return self.alloc.n_blocks

    def prepare_write(self, streams: torch.Tensor, positions: torch.Tensor) -> list[tuple[int, int]]:
        """Make every block the rows `(streams[t], positions[t])` fall in mapped and owned by its
        stream alone. Returns the copy-on-write moves `(old_block, new_block)` whose data the layout
        must copy (all layers) BEFORE writing."""
        bs = self.block_size
        keys = torch.unique(streams.cpu() * self.blocks_per_stream + positions.cpu() // bs).tolist()
        cow = []
        for key in keys:
            stream, idx = divmod(key, self.blocks_per_stream)
            block = int(self.table[stream, idx])
            if block < 0:
                self._set(stream, idx, self.alloc.allocate())
            elif self.alloc.is_shared(block):
                new = self.alloc.allocate()
                self.alloc.free(block)  # still referenced by the other stream(s)
                self._set(stream, idx, new)
                cow.append((block, new))
        return cow

    def locate(self, streams: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(block, row) of each cell, on the streams' device; unmapped cells get block -1."""
        s, p = streams.cpu().long(), positions.cpu().long()
        blocks = self.table[s, p // self.block_size].long()
        return blocks.to(streams.device), (p % self.block_size).to(streams.device)

    def share_prefix(self, src: int, dst: int, n: int) -> None:
        """Map `dst`'s first `n` cells to `src`'s blocks (refcount +1 each): the defrag move.

        `dst`'s old blocks are released first; its cells past `n` end up unmapped."""
        assert src != dst and 0 <= n <= self.blocks_per_stream * self.block_size
        self.free_stream(dst)
        for idx in range(-(-n // self.block_size)):
            block = int(self.table[src, idx])
            if block >= 0:
                self.alloc.share(block)
                self._set(dst, idx, block)

    def free_stream(self, stream: int) -> None:
        """Drop every block reference of `stream`; blocks nobody else maps return to the free list."""
        for idx, block in enumerate(self.table[stream].tolist()):
            if block >= 0:
                self.alloc.free(block)
                self._set(stream, idx, -1)

    def device_table(self) -> torch.Tensor:
        """`[n_streams, blocks_per_stream]` int32 on the layout's device (cached between edits)."""
        if self._device_table is None or self._device_table[0] != self.version:
            self._device_table = (self.version, self.table.to(self.device))
        return self._device_table[1]

    def check(self) -> None:
        """Invariants: each block's refcount equals the number of table entries mapping it."""
        self.alloc.check()
        counts = [0] * self.n_blocks
        for block in self.table.flatten().tolist():
            assert -1 <= block < self.n_blocks, f"table entry {block} out of range"
            if block >= 0:
                counts[block] += 1
        assert counts == self.alloc.refcount, "block refcounts disagree with the block table"

    def _set(self, stream: int, idx: int, block: int) -> None:
        self.table[stream, idx] = block
        self.version += 1


class PagedKVCache:
    """The layout contract on top of a `BlockTable`, for any order of rows inside a block.

    Subclasses (the layout modules) only choose the storage: `make_pages(shape)` returns one pool
    tensor and its logical `[n_layers, n_blocks, block_size, kv_heads, head_dim]` view (e.g. a
    permutation of a heads-first storage). Every write goes through the view, so one code path
    serves every storage order.
    """

    name = "paged"

    def __init__(self, spec, block_size: int) -> None:
        self.spec = spec
        self.blocks = BlockTable(spec.n_streams, spec.n_cells, block_size, spec.device)
        shape = (spec.n_layers, self.blocks.n_blocks, block_size, spec.n_kv_heads, spec.head_dim)
        self.k_store, self.k = self.make_pages(shape)  # store: any order; k: logical view of it
        self.v_store, self.v = self.make_pages(shape)
        self._memo: tuple | None = None  # (streams, positions, table version, blocks, rows)

    def make_pages(self, shape: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError

    @property
    def block_size(self) -> int:
        return self.blocks.block_size

    def write(self, layer: int, streams: torch.Tensor, positions: torch.Tensor,
              k: torch.Tensor, v: torch.Tensor) -> None:
        """Store rows `k[t]`, `v[t]` (`[tokens, kv_heads, head_dim]`) at (streams[t], positions[t]).

        Blocks are allocated (and shared ones copied) on the first layer's write of a batch; the
        other layers reuse that placement (memoised on the very same index tensors)."""
        blocks, rows = self._place(streams, positions)
        self.k[layer].index_put_((blocks, rows), k.to(self.spec.dtype))
        self.v[layer].index_put_((blocks, rows), v.to(self.spec.dtype))

    def view(self, layer: int):
        from slotserver.kv_spec import PagedKV

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
        self.blocks.free_stream(stream)

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
        pools = sum(t.numel() * t.element_size() for t in (self.k_store, self.v_store))
        return pools + self.blocks.table.numel() * self.blocks.table.element_size()

    def check(self) -> None:
        """Assert the allocator and table invariants (tests call this)."""
        self.blocks.check()

    def _place(self, streams: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(block, row) of each written cell, allocating / copying-on-write first. Memoised on the
        index values and the table version, so the other layers of a forward skip the bookkeeping
        (compared by value, not identity: a caller may refill the same index tensors in place)."""
        memo = self._memo
        if (memo and memo[2] == self.blocks.version and memo[0].shape == streams.shape
                and torch.equal(memo[0], streams) and torch.equal(memo[1], positions)):
            return memo[3], memo[4]
        for old, new in self.blocks.prepare_write(streams, positions):
            self.k[:, new] = self.k[:, old]  # copy-on-write: every layer of the shared block
            self.v[:, new] = self.v[:, old]
        blocks, rows = self.blocks.locate(streams, positions)
        self._memo = (streams.clone(), positions.clone(), self.blocks.version, blocks, rows)
        return blocks, rows
