"""Slot save / restore / erase: a slot's cached tokens and KV in a file under `--slot-save-path`.

The KV goes through the layout's canonical export/import (`[n_layers, n, kv_heads, head_dim]`),
so a file saved with one layout restores into any other. File names are validated so nothing
escapes the folder: a plain name (no separators, no `..`, no leading dot), and the resolved path
must still lie inside the folder (no symlink escape). Runs on the engine thread (`Engine.call`).
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import torch

from slotserver.request import RequestError

NAME_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]{0,200}$")
FORMAT = "slotserver-slot-v1"


class SlotBusy(RuntimeError):
    """The slot is processing a request (HTTP 409)."""


def safe_path(folder: Path | None, filename: str) -> Path:
    if folder is None:
        raise RequestError("slot save/restore is disabled: start the server with --slot-save-path")
    if not isinstance(filename, str) or not NAME_RE.match(filename) or ".." in filename:
        raise RequestError(f"invalid slot file name {filename!r}: use letters, digits, '.', '_', '-'")
    root = Path(folder).resolve()
    path = (root / filename).resolve()
    if path.parent != root:
        raise RequestError(f"slot file name {filename!r} escapes the slot save folder")
    return path


def _idle_slot(engine, slot_id: int):
    if not isinstance(slot_id, int) or not 0 <= slot_id < engine.config.n_parallel:
        raise RequestError(f"id_slot must be in [0, {engine.config.n_parallel})")
    slot = engine.sched.slots.slots[slot_id]
    if not slot.idle:
        raise SlotBusy(f"slot {slot_id} is processing a request")
    return slot


def save(engine, slot_id: int, filename: str) -> dict:
    t0 = time.perf_counter()
    path = safe_path(engine.config.slot_save_path, filename)
    slot = _idle_slot(engine, slot_id)
    n = len(slot.cached)
    k, v = engine.cache.export_stream(engine.sched.streams.stream_of[slot_id], n)
    s = engine.bundle.model.spec
    torch.save({"format": FORMAT, "tokens": list(slot.cached), "k": k, "v": v,
                "geometry": [s.n_layers, s.n_kv_heads, s.head_dim]}, path)
    return {"id_slot": slot_id, "filename": filename, "n_saved": n, "n_written": path.stat().st_size,
            "timings": {"save_ms": 1000 * (time.perf_counter() - t0)}}


def restore(engine, slot_id: int, filename: str) -> dict:
    t0 = time.perf_counter()
    path = safe_path(engine.config.slot_save_path, filename)
    slot = _idle_slot(engine, slot_id)
    if not path.is_file():
        raise FileNotFoundError(f"slot file {filename!r} not found")
    try:
        data = torch.load(path, weights_only=True)
        tokens, k, v = list(map(int, data["tokens"])), data["k"], data["v"]
        assert data["format"] == FORMAT
    except Exception as e:  # noqa: BLE001 - any unreadable file is the same user error
        raise RequestError(f"slot file {filename!r} is not a valid slot file ({type(e).__name__})") from None
    s = engine.bundle.model.spec
    if list(data["geometry"]) != [s.n_layers, s.n_kv_heads, s.head_dim] or k.shape != v.shape \
            or tuple(k.shape) != (s.n_layers, len(tokens), s.n_kv_heads, s.head_dim):
        raise RequestError(f"slot file {filename!r} was saved from a different model")
    if len(tokens) > engine.config.n_cells:
        raise RequestError(f"slot file {filename!r} holds {len(tokens)} tokens; the slot has only "
                           f"{engine.config.n_cells} cells")
    engine.cache.import_stream(engine.sched.streams.stream_of[slot_id], k, v)
    slot.cached = tokens
    return {"id_slot": slot_id, "filename": filename, "n_restored": len(tokens), "n_read": path.stat().st_size,
            "timings": {"restore_ms": 1000 * (time.perf_counter() - t0)}}


def erase(engine, slot_id: int) -> dict:
    slot = _idle_slot(engine, slot_id)
    n, slot.cached = len(slot.cached), []
    return {"id_slot": slot_id, "n_erased": n}
