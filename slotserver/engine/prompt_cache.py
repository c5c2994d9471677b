"""`--cache-ram MiB`: llama-server's host-memory prompt cache, shared by every slot.

A slot keeps the KV of its last prompt (its `cached` tokens) until another prompt takes it. With
a RAM cache, that KV is not lost: it is copied to host memory (canonical `[n_layers, n, kv_heads,
head_dim]` tensors, whatever the layout) under its tokens, and a new request whose prompt shares
a longer prefix with a cached entry than with the slot it landed on gets that prefix copied into
its slot instead of computing it again (llama-server's `prompt_save` / `prompt_load` when a slot is
chosen). Entries are evicted least recently used first once their bytes pass the limit.

`--cache-idle-slots` (on by default with a RAM cache, as llama-server): when a request starts,
every idle slot's KV is saved to the cache; with `--kv-unified` (one paged pool for all slots) the
idle slot is then cleared, which gives its blocks to the running requests
(llama.cpp's test_kv_keep_only_active.py). Log lines at debug level (`-v`) carry llama-server's
test tags.

**Prefix sharing across slots** (issue 37), with or without a RAM cache: a request whose prompt
shares a longer prefix with another slot's KV (an idle slot's cache, or the tokens a busy slot has
computed so far) than with its own slot and the RAM cache gets that prefix copied from that slot's
stream (`copy_stream`: a block-table edit on paged layouts, copy-on-write; a memory copy on flat
ones) instead of computing it again. So agents sharing a long system prompt compute it once, on
whichever slot got there first. At least MIN_SHARED tokens, or it is not worth the copy.

Runs on the engine thread, inside the scheduler's admission (its `on_select` / `on_admitted`
hooks): the scheduler stays pure bookkeeping; the copies are made here.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from slotserver.engine.cache_reuse import min_chunk
from slotserver.engine.prefix_index import PrefixIndex
from slotserver.engine.slots import Slot, common_prefix

if TYPE_CHECKING:
    from slotserver.engine.disk_cache import DiskCache
    from slotserver.engine.engine import Engine
    from slotserver.engine.sequence import Sequence

log = logging.getLogger("slotserver.engine.prompt_cache")

MIN_SHARED = 16   # tokens: a shorter prefix found in another slot is recomputed rather than copied


@dataclass
class Entry:
    k: torch.Tensor        # [n_layers, n, kv_heads, head_dim], on the host
    v: torch.Tensor
    nbytes: int


class PromptCache:
    """Token prefix -> host K/V, LRU by bytes (`limit` < 0: no limit). `index` (prefix_index) finds
    the longest shared prefix without comparing every entry; it follows every change to `entries`
    (save, eviction, the LRU order), so change entries only through these methods.
    Entries live under the name of the adapters their KV was computed with (`ns`, "": the base
    model; engine/lora_scales.py), one index each: a lookup only sees its own name's entries."""

    def __init__(self, limit_bytes: int) -> None:
        self.limit = limit_bytes
        self.entries: OrderedDict[tuple[str, tuple[int, ...]], Entry] = OrderedDict()
        self.indexes: dict[str, PrefixIndex] = {}
        self.bytes = 0
        self.hits = 0

    def __contains__(self, tokens: tuple[int, ...]) -> bool:
        return self.has(tokens, "")

    def has(self, tokens: tuple[int, ...], ns: str) -> bool:
        return (ns, tokens) in self.entries

    def save(self, tokens: tuple[int, ...], k: torch.Tensor, v: torch.Tensor, ns: str = "") -> bool:
        """Keep (tokens, K, V) under `ns`; -> False when it alone exceeds the limit (not kept)."""
        nbytes = k.numel() * k.element_size() + v.numel() * v.element_size()
        if not tokens or (0 <= self.limit < nbytes):
            return False
        index = self.indexes.setdefault(ns, PrefixIndex())
        if (ns, tokens) in self.entries:
            self.entries.move_to_end((ns, tokens))
            index.touch(tokens)
            return True
        self.entries[(ns, tokens)] = Entry(k.cpu(), v.cpu(), nbytes)
        index.add(tokens)
        self.bytes += nbytes
        while 0 <= self.limit < self.bytes:
            (old_ns, old_tokens), old = self.entries.popitem(last=False)
            self.indexes[old_ns].remove(old_tokens)
            self.bytes -= old.nbytes
        return True

    def best(self, prompt: tuple[int, ...], ns: str = "") -> tuple[tuple[int, ...], Entry, int] | None:
        """The entry of `ns` sharing the longest prefix with `prompt` (and that length; ties: the least
        recently used), or None when none shares a token; the entry becomes the most recently used.
        O(len(prompt) / BLOCK + the entries sharing the prompt's deepest full block), not O(entries)."""
        index = self.indexes.get(ns)
        found = index.best(prompt) if index is not None else None
        if found is None:
            return None
        tokens, n = found
        self.entries.move_to_end((ns, tokens))
        index.touch(tokens)
        return tokens, self.entries[(ns, tokens)], n


class RamCacheHooks:
    """The scheduler's admission hooks that move KV between slots and the RAM cache (`cache`; None:
    --cache-ram 0, and only the slot-to-slot sharing runs)."""

    def __init__(self, engine: "Engine", cache: PromptCache | None, idle_slots: bool, unified: bool,
                 disk: "DiskCache | None" = None) -> None:
        self.e, self.cache, self.unified, self.disk = engine, cache, unified, disk
        self.idle_slots = idle_slots and (cache is not None or disk is not None)
        self.shared = 0   # requests that took a prefix from another slot
        if self.idle_slots:
            log.debug("idle slots will be saved to prompt cache%s upon starting a new task",
                      " and cleared" if unified else "")
            log.debug("__TEST_TAG_CACHE_IDLE_SLOTS_ENABLED__")

    def on_select(self, slot: Slot, seq: "Sequence") -> None:
        """Before the slot's reuse is counted: a longer prefix, from another slot or the RAM cache,
        replaces the slot's KV."""
        prompt, ns = tuple(seq.tokens[: seq.num_prompt]), seq.cache_ns
        own = common_prefix(slot.cached_for(ns), prompt)
        if own < len(slot.cached):   # about to be overwritten: keep it in RAM (and on disk) first
            self._save(slot)
        if not seq.request.cache_prompt:
            return
        source, n_slot = self._best_slot(slot, prompt, ns)
        found = self.cache.best(prompt, ns) if self.cache is not None else None
        n_ram = found[2] if found is not None else 0
        if self._from_disk(slot, seq, prompt, max(own, n_slot, n_ram)):
            return
        if n_ram > max(own, n_slot):
            tokens, entry, n = found
            n = self._restore_len(seq, tokens, n)
            log.debug("updating prompt cache: slot %d takes %d cached tokens", slot.id, n)
            self.e.cache.import_stream(self._stream(slot), entry.k[:, :n], entry.v[:, :n])
            slot.cached, slot.ns = list(tokens[:n]), ns
            self.cache.hits += 1
        elif source is not None and n_slot >= own + MIN_SHARED:
            log.debug("slot %d takes a %d-token prefix from slot %d", slot.id, n_slot, source.id)
            self.e.cache.layout.copy_stream(self._stream(source), self._stream(slot), n_slot)
            slot.cached, slot.ns = list(prompt[:n_slot]), ns
            self.shared += 1

    def _from_disk(self, slot: Slot, seq: "Sequence", prompt: tuple[int, ...], n_memory: int) -> bool:
        """--cache-disk: a longer prefix than memory offers, read back into the slot (and kept in RAM)."""
        found = self.disk.best(prompt, seq.cache_ns) if self.disk is not None else None
        if found is None or found[1] <= n_memory:
            return False
        tokens, n = found
        n = self._restore_len(seq, tokens, n)
        kv = self.disk.load(tokens, seq.cache_ns)
        if kv is None:   # did not check out (logged, deleted): memory's best, if any, still serves
            return False
        log.debug("slot %d takes %d tokens from the disk cache", slot.id, n)
        self.e.cache.import_stream(self._stream(slot), kv[0][:, :n], kv[1][:, :n])
        slot.cached, slot.ns = list(tokens[:n]), seq.cache_ns
        if self.cache is not None:
            self.cache.save(tokens, *kv, ns=seq.cache_ns)
        return True

    def _restore_len(self, seq: "Sequence", tokens: tuple[int, ...], n: int) -> int:
        """Cells of a cached entry to put in the slot: its common prefix with the prompt, or all of it
        when the request reuses chunks past the prefix (--cache-reuse; llama-server restores whole
        entries) and every stream may hold a full slot (no --kv-pool-cells limit to overrun)."""
        whole = min_chunk(seq, self.e.config) > 0 and self.e.cache.spec.pool_cells is None
        return len(tokens) if whole else n

    def on_stop(self) -> None:
        """The engine stopped: every slot's KV to disk (--cache-disk), so a restart finds it."""
        if self.disk is None:
            return
        try:
            for slot in self.e.sched.slots.slots:
                if slot.n_valid:
                    tokens = slot.valid_tokens()
                    k, v = self.e.cache.export_stream(self._stream(slot), len(tokens))
                    self.disk.save(tuple(tokens), k.cpu(), v.cpu(), slot.ns)
        except Exception as e:  # noqa: BLE001 - asleep (KV released) or a lab layout failing: stop anyway
            log.warning("disk cache: the slots could not be saved at stop (%s)", e)
        self.disk.flush()

    def holds_back(self, seq: "Sequence", running: list) -> bool:
        """Whether `seq` should wait: a running sequence still prefilling computes a prefix of at least
        MIN_SHARED tokens that `seq`'s prompt shares, so `seq` will copy it instead of computing it
        too (concurrent requests with one long system prompt compute it once). The wait lasts that
        prefill; only prefilling sequences are compared (usually none or one)."""
        if not seq.request.cache_prompt:
            return False
        prompt = seq.tokens[: seq.num_prompt]
        for other in running:
            if other.num_computed < other.prompt_end and other.request.cache_prompt \
                    and other.cache_ns == seq.cache_ns:
                n = common_prefix(other.tokens[: other.prompt_end], prompt)
                if n >= MIN_SHARED and other.num_computed < n:
                    return True
        return False

    def _best_slot(self, slot: Slot, prompt: tuple[int, ...], ns: str) -> tuple[Slot | None, int]:
        """The other slot whose valid KV (computed under adapters `ns`) shares the longest prefix with
        `prompt`, and that length: an idle slot's cache, a busy one's computed tokens (its stream
        holds exactly those)."""
        best, n_best = None, 0
        as_list = list(prompt)   # slots hold lists: common_prefix then compares slices as they are
        for other in self.e.sched.slots.slots:
            if other is slot or other.ns != ns:
                continue
            n = common_prefix(other.valid_tokens(), as_list)
            if n > n_best:
                best, n_best = other, n
        return best, n_best

    def on_admitted(self) -> None:
        """After a request took its slot: idle slots to the cache (and cleared with a shared pool)."""
        if not self.idle_slots:
            return
        for slot in self.e.sched.slots.idle():
            if slot.cached and self._save(slot):
                log.debug("slot %d: __TEST_TAG_CACHE_IDLE_SLOT__", slot.id)
            if self.unified and slot.cached:
                slot.cached = []
                self.e.cache.trim(self._stream(slot), 0)

    def _save(self, slot: Slot) -> bool:
        """The slot's cache into each store that lacks it (RAM, disk); -> whether anything was kept."""
        tokens = tuple(slot.cached)
        to_ram = self.cache is not None and not self.cache.has(tokens, slot.ns)
        to_disk = self.disk is not None and not self.disk.has(tokens, slot.ns)
        if not tokens or not (to_ram or to_disk):
            return False
        k, v = self.e.cache.export_stream(self._stream(slot), len(tokens))
        if to_disk:
            self.disk.save(tokens, k.cpu(), v.cpu(), slot.ns)
        return self.cache.save(tokens, k, v, ns=slot.ns) if to_ram else True

    def _stream(self, slot: Slot) -> int:
        return self.e.sched.streams.stream_of[slot.id]
