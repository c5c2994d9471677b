"""The shared machinery of paged KV layouts (vLLM style): a refcounted block pool that grows on
demand, per-stream block tables, and (paged_cache.py) `PagedKVCache`, the layout contract on top of them.

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



def __getattr__(name: str):
    """`PagedKVCache` moved to paged_cache.py; lab copies of the layouts made before (`slotserver lab
    init`) import it from here, so it is still found (lazily: paged_cache imports this module)."""
    if name == "PagedKVCache":
        from slotserver.runtime.paged_cache import PagedKVCache
        return PagedKVCache
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
