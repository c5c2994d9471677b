"""`--cache-disk DIR`: prompt-cache entries on disk, so a restart does not forget an agent's history.

An entry is one slot's prompt and its canonical K/V (`[n_layers, n, kv_heads, head_dim]`, the
layout's export, so any layout of the same KV type restores it), written when the KV leaves a slot
(with the RAM cache's saves) and when the engine stops. A new request whose prompt shares a longer
prefix with an entry than with anything in memory gets that prefix read back into its slot.

Files live in `DIR/<model key>/`, the key a hash of the model file (its size and its first and
last 4 MiB: a whole 8 GB file would take seconds to hash at every start), the KV type and the
cache's geometry, so another model's or another KV type's entries are never looked at. Each file
is a JSON header line (format, key, tokens, dtype, shape, payload CRC-32) followed by K then V;
writes are atomic (atomic_file.atomic_write: temporary file, fsync, rename) and made by a
background thread, so the engine never waits for a disk. Loads trust nothing: a file whose
header, key, size, CRC or values do not check out is skipped with a log line and deleted, never
loaded. Past `limit` bytes the least recently used files go (their modification time is touched
on each load).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import queue
import threading
import zlib
from pathlib import Path

import torch

from slotserver.engine.prefix_index import PrefixIndex
from slotserver.engine.atomic_file import atomic_write, remove_stale_temporaries
from slotserver.hub.cache import part_names

log = logging.getLogger("slotserver.engine.disk_cache")

FORMAT = "slotserver-prompt-cache-1"
SUFFIX = ".kvc"
SAMPLE = 4 << 20   # bytes hashed at each end of the model file
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def model_key(model_path: Path, kv_dtype: torch.dtype, geometry: tuple[int, int, int]) -> str:
    """A short hash naming the model file (every part of a split GGUF: its first may hold metadata
    alone), the KV type and the (layers, kv heads, head_dim)."""
    h = hashlib.sha256()
    for path in _parts(model_path):
        size = path.stat().st_size
        with path.open("rb") as f:
            h.update(f.read(SAMPLE))
            f.seek(max(0, size - SAMPLE))
            h.update(f.read(SAMPLE))
        h.update(f"{size}|".encode())
    h.update(f"{kv_dtype}|{geometry}".encode())
    return h.hexdigest()[:24]


def _parts(path: Path) -> list[Path]:
    """A split GGUF's parts (llama.cpp's names, model/gguf_split.py), else [path]."""
    return [path.with_name(name) for name in part_names(path.name)]


class DiskCache:
    """Token prefix -> a file; entries indexed at start from their headers, loaded on demand.

    `index` (tokens -> file) and `prefixes` (its prefix_index, for `best`) change together under
    `_lock`: the writer thread adds and evicts while the engine thread looks up and drops."""

    def __init__(self, folder: Path, limit_bytes: int, key: str, dtype: torch.dtype) -> None:
        self.folder, self.limit, self.key, self.dtype = Path(folder) / key, limit_bytes, key, dtype
        self.folder.mkdir(parents=True, exist_ok=True)
        remove_stale_temporaries(self.folder)
        # entry key -> file: the tokens, or (ns, tokens) for KV computed under LoRA adapters `ns`
        # (engine/lora_scales.py); one prefix index per ns, so a lookup sees only its own
        self.index: dict[tuple, Path] = {}
        self.prefixes: dict[str, PrefixIndex] = {"": PrefixIndex()}
        self._lock = threading.Lock()
        for path in sorted(self.folder.glob("*" + SUFFIX), key=lambda p: p.stat().st_mtime):
            header = self._header(path)
            if header is not None:
                self._put(_key(tuple(header["tokens"]), header.get("ns", "")), path)
        self.hits = self.writes = 0
        self._queue: queue.Queue = queue.Queue()
        self._writer = threading.Thread(target=self._write_loop, name="disk-cache-writer", daemon=True)
        self._writer.start()

    # -- the engine thread --------------------------------------------------------------------------
    def has(self, tokens: tuple[int, ...], ns: str = "") -> bool:
        return _key(tokens, ns) in self.index

    def save(self, tokens: tuple[int, ...], k: torch.Tensor, v: torch.Tensor, ns: str = "") -> None:
        """Queue an entry for the writer (k, v: host tensors nobody writes to again), computed under
        adapters `ns`."""
        if tokens and not self.has(tokens, ns):
            self._queue.put((tokens, k, v, ns))

    def best(self, prompt: tuple[int, ...], ns: str = "") -> tuple[tuple[int, ...], int] | None:
        """The indexed entry of `ns` sharing the longest prefix with `prompt`, and that length (ties:
        the first indexed; loads do not reorder), or None. Not a scan of every entry: see prefix_index."""
        with self._lock:
            index = self.prefixes.get(ns)
            return index.best(prompt) if index is not None else None

    def load(self, tokens: tuple[int, ...], ns: str = "") -> tuple[torch.Tensor, torch.Tensor] | None:
        """The entry's K, V; None (logged, file deleted) if it does not check out."""
        key = _key(tokens, ns)
        path = self.index.get(key)
        if path is None:   # evicted by the writer since `best`
            return None
        try:
            k, v = self._read(path)
        except (OSError, ValueError, KeyError, TypeError, RuntimeError) as e:
            log.warning("disk cache: skipping %s (%s)", path, e)
            self._drop(key)
            return None
        os.utime(path)   # recently used: evicted last
        self.hits += 1
        return k, v

    def flush(self, timeout: float = 30.0) -> None:
        """Wait until every queued entry is written (engine stop)."""
        done = threading.Event()
        self._queue.put(done)
        done.wait(timeout)

    # -- files ------------------------------------------------------------------------------------
    def _header(self, path: Path) -> dict | None:
        try:
            with path.open("rb") as f:
                header = json.loads(f.readline())
            ok = header["format"] == FORMAT and header["key"] == self.key and isinstance(header["tokens"], list)
        except (OSError, ValueError, KeyError, TypeError):
            ok = False
        if not ok:
            log.warning("disk cache: skipping %s (not an entry of this model and KV type)", path)
            path.unlink(missing_ok=True)
            return None
        return header

    def _read(self, path: Path) -> tuple[torch.Tensor, torch.Tensor]:
        with path.open("rb") as f:
            header = json.loads(f.readline())
            payload = bytearray(f.read())   # writable: torch.frombuffer views it, no second copy
        if header["format"] != FORMAT or header["key"] != self.key or DTYPES[header["dtype"]] != self.dtype:
            raise ValueError("another model's or KV type's entry")
        shape = tuple(header["shape"])
        half = torch.Size(shape).numel() * self.dtype.itemsize
        if len(payload) != 2 * half or zlib.crc32(payload) != header["crc32"] or shape[1] != len(header["tokens"]):
            raise ValueError("truncated or corrupt")
        kv = torch.frombuffer(payload, dtype=self.dtype)
        k, v = kv[: half // self.dtype.itemsize].view(shape), kv[half // self.dtype.itemsize:].view(shape)
        if not (torch.isfinite(k).all() and torch.isfinite(v).all()):
            raise ValueError("NaN or infinite K/V")
        return k, v

    def _write(self, tokens: tuple[int, ...], k: torch.Tensor, v: torch.Tensor, ns: str = "") -> None:
        payload = k.contiguous().view(torch.uint8).numpy().tobytes() + v.contiguous().view(torch.uint8).numpy().tobytes()
        header = {"format": FORMAT, "key": self.key, "tokens": list(tokens), "shape": list(k.shape),
                  "dtype": str(k.dtype).removeprefix("torch."), "crc32": zlib.crc32(payload)} | ({"ns": ns} if ns else {})
        key = _key(tokens, ns)
        path = self.folder / (hashlib.sha256(repr(key).encode()).hexdigest()[:32] + SUFFIX)
        atomic_write(path, lambda f: f.write(json.dumps(header).encode() + b"\n" + payload))
        self._put(key, path)
        self.writes += 1
        self._evict()

    def _evict(self) -> None:
        files = sorted(self.folder.glob("*" + SUFFIX), key=lambda p: p.stat().st_mtime)
        total = sum(p.stat().st_size for p in files)
        by_path = {p: t for t, p in list(self.index.items())}
        while files and 0 <= self.limit < total:
            old = files.pop(0)
            total -= old.stat().st_size
            old.unlink(missing_ok=True)
            if old in by_path:
                self._pop(by_path[old])

    def _drop(self, key: tuple) -> None:
        path = self._pop(key)
        if path is not None:
            path.unlink(missing_ok=True)

    def _put(self, key: tuple, path: Path) -> None:
        """Index an entry; one already in keeps its place (as a dict key does): `best`'s tie-break."""
        ns, tokens = _split(key)
        with self._lock:
            self.index[key] = path
            prefixes = self.prefixes.setdefault(ns, PrefixIndex())
            if tokens not in prefixes:
                prefixes.add(tokens)

    def _pop(self, key: tuple) -> Path | None:
        ns, tokens = _split(key)
        with self._lock:
            self.prefixes[ns].remove(tokens)
            return self.index.pop(key, None)

    def _write_loop(self) -> None:
        while True:
            item = self._queue.get()
            if isinstance(item, threading.Event):
                item.set()
                continue
            try:
                self._write(*item)
            except OSError as e:   # a full or read-only disk costs the entry, never the server
                log.warning("disk cache: could not write an entry (%s)", e)


def _key(tokens: tuple[int, ...], ns: str) -> tuple:
    """An entry's index key: its tokens (the base model's KV), or (ns, tokens) under adapters `ns`."""
    return (ns, tokens) if ns else tokens


def _split(key: tuple) -> tuple[str, tuple[int, ...]]:
    return key if key and isinstance(key[0], str) else ("", key)
