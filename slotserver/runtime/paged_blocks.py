"""The shared machinery of paged KV layouts (vLLM style): a refcounted block pool that grows on
demand, per-stream block tables, and `PagedKVCache`, the layout contract on top of them.

Paged layouts (`layouts/paged.py`, `layouts/paged_hnd.py`) differ only in how a block stores its
rows; both keep their K/V pages in one pool tensor of `capacity` blocks of `block_size` cells, and
find cell `c` of stream `s` at row `c % block_size` of block `table[s, c // block_size]`.
`BlockAllocator` and `BlockTable` own that mapping and never touch K/V data: they tell the cache
which (block, row) to write, which blocks to copy first (copy-on-write) and which to relocate
before the pool shrinks.

Why the pool grows and shrinks: memory must follow the tokens held, not `n_streams * n_cells`.
The attention kernels read the pool as ONE strided tensor (`PagedKV.k_pages`), so growing means
reallocating and copying; the capacity doubles (amortised O(1) per block) up to `max_blocks`, and
halves-or-more when at most a quarter is used (the used blocks are first moved to the lowest ids),
so a busy pool never thrashes between the two.

Why refcounts: the defrag move (`copy_stream`) must be a table edit, not a data copy. Sharing a
block between two streams is only safe if neither can write into it while shared, so
`prepare_write` gives a writer its own copy of a shared block first (copy-on-write). A block goes
back to the free list when its last reference is dropped.

Running out: the pool may not hold every stream full (`KVSpec.pool_cells`); the scheduler admits
by free blocks (`KVBudget`, slotserver/runtime/paged_contract.py, built from `block_size` and
`max_blocks`) so a write never needs more than `max_blocks`. If it ever would, the
allocator fails loudly ("KV block pool exhausted") instead of overwriting another stream's cells.
"""

from __future__ import annotations

import contextlib

import heapq

import torch

MIN_BLOCKS = 16  # smallest capacity once grown; the pool never shrinks below it


class BlockAllocator:
    """Block ids `0..capacity-1` with reference counts, capacity at most `max_blocks`.

    Verbs come in pairs with asserted invariants: `allocate` (refcount 1) / `free` (drop one
    reference; `share` adds one), `reserve(n)` (capacity grows to n) / `release(n)` (capacity
    shrinks to n; every id past n must be free). The lowest free id is handed out first, so used
    blocks gather at the bottom and the top of the pool can be released."""

    def __init__(self, max_blocks: int, capacity: int = 0) -> None:
        assert 0 <= capacity <= max_blocks and max_blocks > 0
        self.max_blocks = max_blocks
        self.refcount: list[int] = []
        self.free_heap: list[int] = []
        self.reserve(capacity)

    @property
    def capacity(self) -> int:
        return len(self.refcount)

    @property
    def n_free(self) -> int:
        return len(self.free_heap)

    @property
    def n_used(self) -> int:
        return self.capacity - self.n_free

    def reserve(self, capacity: int) -> None:
        assert self.capacity <= capacity <= self.max_blocks, f"cannot grow {self.capacity} -> {capacity}"
        for block in range(self.capacity, capacity):
            self.refcount.append(0)
            heapq.heappush(self.free_heap, block)

    def release(self, capacity: int) -> None:
        assert 0 <= capacity <= self.capacity
        assert all(ref == 0 for ref in self.refcount[capacity:]), "releasing blocks still in use"
        del self.refcount[capacity:]
        self.free_heap = [b for b in self.free_heap if b < capacity]
        heapq.heapify(self.free_heap)

    def allocate(self) -> int:
        assert self.free_heap, f"KV block pool exhausted ({self.capacity} of {self.max_blocks} blocks in use)"
        block = heapq.heappop(self.free_heap)
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
            heapq.heappush(self.free_heap, block)

    def is_shared(self, block: int) -> bool:
        return self.refcount[block] > 1

    def check(self) -> None:
        """Invariants: a block is free (refcount 0, on the free list exactly once) or used, never both."""
        assert self.capacity <= self.max_blocks
        free = set(self.free_heap)
        assert len(free) == len(self.free_heap), "a block is on the free list twice"
        for block, ref in enumerate(self.refcount):
            assert ref >= 0, f"block {block} has refcount {ref}"
            assert (ref == 0) == (block in free), f"block {block}: refcount {ref}, on free list {block in free}"
        assert all(b < self.capacity for b in free), "a free block past the capacity"


class BlockTable:
    """Which block holds each stream's cells. `-1` marks an unmapped entry (never written, or freed).

    The table lives on the CPU (bookkeeping is scalar work); `device_table()` is the copy the
    attention kernels read, rebuilt only after an edit (`version` counts edits).
    """

    def __init__(self, n_streams: int, n_cells: int, block_size: int, max_blocks: int,
                 device: str | torch.device = "cpu") -> None:
        assert block_size > 0
        self.block_size = block_size
        self.blocks_per_stream = -(-n_cells // block_size)
        self.alloc = BlockAllocator(max_blocks)
        self.table = torch.full((n_streams, self.blocks_per_stream), -1, dtype=torch.int32)
        self.device = device
        self._on_cpu = torch.device(device).type == "cpu"
        self.version = 0
        self._device_table: tuple[int, torch.Tensor] | None = None

    @property
    def n_blocks(self) -> int:
        """The pool's current capacity in blocks (what the K/V tensors hold)."""
        return self.alloc.capacity

    def _touched(self, streams: torch.Tensor, positions: torch.Tensor) -> list[tuple[int, int]]:
        keys = torch.unique(streams.cpu() * self.blocks_per_stream + positions.cpu() // self.block_size)
        return [divmod(k, self.blocks_per_stream) for k in keys.tolist()]

    def blocks_needed(self, streams: torch.Tensor, positions: torch.Tensor) -> int:
        """Fresh blocks `prepare_write` would take for these cells (unmapped or shared ones)."""
        entries = [int(self.table[s, i]) for s, i in self._touched(streams, positions)]
        return sum(1 for b in entries if b < 0 or self.alloc.is_shared(b))

    def prepare_write(self, streams: torch.Tensor, positions: torch.Tensor) -> list[tuple[int, int]]:
        """Make every block the rows `(streams[t], positions[t])` fall in mapped and owned by its
        stream alone. Returns the copy-on-write moves `(old_block, new_block)` whose data the layout
        must copy (all layers) BEFORE writing."""
        cow = []
        for stream, idx in self._touched(streams, positions):
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
        self.trim_stream(dst, 0)
        for idx in range(-(-n // self.block_size)):
            block = int(self.table[src, idx])
            if block >= 0:
                self.alloc.share(block)
                self._set(dst, idx, block)

    def trim_stream(self, stream: int, n: int) -> None:
        """Drop the block references past the block holding cell `n - 1` (all of them for n=0);
        blocks nobody else maps return to the free list."""
        for idx, block in enumerate(self.table[stream].tolist()):
            if block >= 0 and idx * self.block_size >= n:
                self.alloc.free(block)
                self._set(stream, idx, -1)

    def compact(self, capacity: int) -> list[tuple[int, int]]:
        """Move every used block at or past `capacity` to a free id below it, so `release(capacity)`
        can follow. -> the moves `(old, new)` whose data the layout must copy before shrinking."""
        assert self.alloc.n_used <= capacity
        low_free = sorted(b for b in self.alloc.free_heap if b < capacity)
        moves = [(old, low_free.pop(0)) for old in range(capacity, self.n_blocks) if self.alloc.refcount[old]]
        for old, new in moves:
            self.alloc.free_heap.remove(new)
            self.alloc.refcount[new], self.alloc.refcount[old] = self.alloc.refcount[old], 0
            self.alloc.free_heap.append(old)
            self.table[self.table == old] = new
        heapq.heapify(self.alloc.free_heap)
        self.version += 1
        return moves

    def device_table(self) -> torch.Tensor:
        """`[n_streams, blocks_per_stream]` int32 on the layout's device, refreshed after an edit.

        One persistent tensor, refreshed in place: a CUDA graph captured with it reads the table of
        the step it replays (a new tensor per edit would leave the graph reading a stale one). On
        the CPU it is the table itself."""
        if self._on_cpu:
            return self.table
        if self._device_table is None:
            self._device_table = (self.version, self.table.to(self.device))
        elif self._device_table[0] != self.version:
            self._device_table[1].copy_(self.table)
            self._device_table = (self.version, self._device_table[1])
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
