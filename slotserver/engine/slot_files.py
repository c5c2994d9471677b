"""Slot save / restore / erase: a slot's cached tokens and KV in a file under `--slot-save-path`.

The KV goes through the layout's canonical export/import (`[n_layers, n, kv_heads, head_dim]`),
so a file saved with one layout restores into any other of the same dtype. File names are
validated so nothing escapes the folder: a plain name (no separators, no `..`, no leading dot),
and the resolved path must still lie inside the folder (no symlink escape). Runs on the engine
thread (`Engine.call`).

Saves are atomic (`atomic_file.atomic_write`): a crash or kill mid-save leaves the previous file or the new
one, never a truncated one; the temporary file a killed save leaves behind is removed at the next
start and by the next save (`remove_stale_temporaries`). A save writes only the slot's own cells,
whatever its layout's export returns (`_own_storage`). A name that is a folder is a RequestError
(HTTP 400), for save and restore alike. Restores trust nothing in the file: token ids must lie in
the running model's vocabulary, K/V must have the running cache's geometry and dtype and be
finite, because a restored slot is decoded from directly (an out-of-range id would index past
the embedding).
"""

from __future__ import annotations

import logging
import re
import time
from pathlib import Path

import torch

from slotserver.engine.atomic_file import atomic_write, remove_stale_temporaries
from slotserver.engine.port import KVGeometry, SlotBusy  # noqa: F401 - SlotBusy: HTTP 409
from slotserver.engine.recurrent_policy import refuse_slot_files
from slotserver.engine.request import RequestError

NAME_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,200}")
FORMAT = "slotserver-slot-v1"
log = logging.getLogger("slotserver.slots")


def check_name(filename: object) -> str:
    """`filename` if it is a plain slot file name, else RequestError.

    The whole string must match (`fullmatch`: `$` alone would accept a trailing newline), it
    may not start with a dot (temporary files of `atomic_write` do, so they never collide with
    user files) and may not contain `..`. Shared with the HTTP route: one rule, one place.
    """
    if not isinstance(filename, str) or not NAME_RE.fullmatch(filename) or ".." in filename:
        raise RequestError(f"invalid slot file name {filename!r}: use letters, digits, '.', '_', '-'")
    return filename


def safe_path(folder: Path | None, filename: str) -> Path:
    if folder is None:
        raise RequestError("slot save/restore is disabled: start the server with --slot-save-path")
    check_name(filename)
    root = Path(folder).resolve()
    path = (root / filename).resolve()
    if path.parent != root:
        raise RequestError(f"slot file name {filename!r} escapes the slot save folder")
    return path


def _refuse_folder(path: Path, filename: str) -> None:
    """RequestError (400) for a name that is a folder: a save would fail only at the final rename
    (IsADirectoryError, a 500), a restore would say "not found" of something that is there."""
    if path.is_dir():
        raise RequestError(f"slot file name {filename!r} is a folder in the slot save folder, not a file")


def _own_storage(t: torch.Tensor) -> torch.Tensor:
    """`t`, or a compact copy unless it is exactly its storage: torch.save writes a tensor's whole
    storage, so an export that returned a view of the cache (even an empty one) would put every
    slot's K/V into this slot's file. Layouts return copies; this keeps a lab layout honest too."""
    own = t.numel() * t.element_size()
    if t.is_contiguous() and t.storage_offset() == 0 and t.untyped_storage().nbytes() == own:
        return t
    return t.clone(memory_format=torch.contiguous_format)


def save(engine, slot_id: int, filename: str) -> dict:
    t0 = time.perf_counter()
    refuse_slot_files(engine.bundle.model)
    folder = engine.config.slot_save_path
    path = safe_path(folder, filename)
    engine.port.require_idle(slot_id)   # a busy slot is 409 before the file is looked at, as in restore
    _refuse_folder(path, filename)
    remove_stale_temporaries(folder)
    tokens, k, v = engine.port.export_slot(slot_id)       # K/V in the cache's dtype: what restore requires
    g = engine.port.geometry()
    data = {"format": FORMAT, "tokens": tokens, "k": _own_storage(k), "v": _own_storage(v),
            "geometry": [g.n_layers, g.n_kv_heads, g.head_dim], "lora_ns": engine.port.slot_ns(slot_id)}
    written = atomic_write(path, lambda f: torch.save(data, f))
    return {"id_slot": slot_id, "filename": filename, "n_saved": len(tokens), "n_written": written,
            "timings": {"save_ms": 1000 * (time.perf_counter() - t0)}}


def _read(path: Path, filename: str) -> tuple[list, torch.Tensor, torch.Tensor, list, str]:
    """(tokens, k, v, geometry, lora_ns) as stored, or RequestError if the file is not a slot file.
    lora_ns: the LoRA adapters the KV was computed under (engine/lora_scales.py); "" in files from
    before adapters, which had none."""
    try:
        data = torch.load(path, weights_only=True)
        tokens, k, v, geometry = data["tokens"], data["k"], data["v"], list(data["geometry"])
        ns = data.get("lora_ns", "")
        assert data["format"] == FORMAT and isinstance(tokens, list) and isinstance(ns, str)
        assert isinstance(k, torch.Tensor) and isinstance(v, torch.Tensor)
    except Exception as e:  # noqa: BLE001 - any unreadable file is the same user error
        raise RequestError(f"slot file {filename!r} is not a valid slot file ({type(e).__name__})") from None
    return tokens, k, v, geometry, ns


def _check(g: KVGeometry, filename: str, tokens: list, k: torch.Tensor, v: torch.Tensor, geometry: list) -> None:
    """RequestError naming the first way the file does not fit the running model and cache."""
    s, where = g, f"slot file {filename!r}"
    if geometry != [s.n_layers, s.n_kv_heads, s.head_dim] or k.shape != v.shape \
            or tuple(k.shape) != (s.n_layers, len(tokens), s.n_kv_heads, s.head_dim):
        raise RequestError(f"{where} was saved from a different model")
    if len(tokens) > g.n_cells:
        raise RequestError(f"{where} holds {len(tokens)} tokens; the slot has only {g.n_cells} cells")
    for i, t in enumerate(tokens):
        if type(t) is not int or not 0 <= t < s.vocab_size:
            raise RequestError(f"{where}: token id {t!r} at position {i} is outside the vocabulary "
                               f"({s.vocab_size} tokens)")
    want = g.dtype  # what export_slot produces for this cache
    if k.dtype != want or v.dtype != want:
        raise RequestError(f"{where}: K/V dtype {k.dtype} does not match the running cache ({want})")
    if not (torch.isfinite(k).all() and torch.isfinite(v).all()):
        raise RequestError(f"{where}: K/V holds NaN or infinite values")


def restore(engine, slot_id: int, filename: str) -> dict:
    t0 = time.perf_counter()
    refuse_slot_files(engine.bundle.model)
    path = safe_path(engine.config.slot_save_path, filename)
    engine.port.require_idle(slot_id)   # a busy slot is 409 before the file is even looked at
    _refuse_folder(path, filename)
    if not path.is_file():
        raise FileNotFoundError(f"slot file {filename!r} not found")
    tokens, k, v, geometry, ns = _read(path, filename)
    _check(engine.port.geometry(), filename, tokens, k, v, geometry)
    engine.port.import_slot(slot_id, tokens, k, v, ns)
    return {"id_slot": slot_id, "filename": filename, "n_restored": len(tokens), "n_read": path.stat().st_size,
            "timings": {"restore_ms": 1000 * (time.perf_counter() - t0)}}


def erase(engine, slot_id: int) -> dict:
    return {"id_slot": slot_id, "n_erased": engine.port.erase_slot(slot_id)}
